"""``predict``'s side of the shell: argument checks, the carried state, and the key rule.

:func:`predict_keys` is the one rule every agent (``DreamerV3``, ``TDMPC2``, ``TDMPC2MultiTask``)
draws its ``predict`` randomness by: with ``deterministic=True`` each row's key is a function of
that row's inputs alone; otherwise the keys come from the model's own predict stream.
"""

from __future__ import annotations

import warnings
import zlib
from typing import Any

import jax
import numpy as np
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

from sb3_worldmodels.blocks.random import fold_in_rows
from sb3_worldmodels.common.agent_hooks import AgentHooks
from sb3_worldmodels.common.boundary import (
    AgentObservation,
    check_finite_arrays,
    observation_rows,
    refuse_non_finite_actions,
)
from sb3_worldmodels.common.policy import JaxPolicy

DETERMINISTIC_PREDICT_SEED = 0  # the base key of deterministic predicts (folded with each row's inputs)
STATE_FIX = "pass back the state that predict returned, or None (with episode_start) to start afresh."


def predict_keys(deterministic: bool, stream_key: jax.Array, call: int, *inputs: Any) -> jax.Array:
    """(n, 2) PRNG keys for a ``predict`` call on n rows, one per row.

    ``deterministic=True``: each row's key is derived from that row's ``inputs`` (each with a leading
    axis n: observation, state, ...) alone, so the action is a function of the inputs and the weights:
    the same whatever came before, across save/load, and in another model given these weights by
    ``set_parameters``. Otherwise the keys are split from ``stream_key`` folded with ``call``, the
    model's count of such calls (the caller advances it).
    """
    if deterministic:
        return fold_in_rows(jax.random.PRNGKey(DETERMINISTIC_PREDICT_SEED), row_digests(*inputs))
    return jax.random.split(jax.random.fold_in(stream_key, call), len(inputs[0]))


def row_digests(*arrays: Any) -> np.ndarray:
    """(n,) uint32 CRC-32 of each row's bytes over ``arrays`` (each with a leading axis n)."""
    rows = [np.ascontiguousarray(np.asarray(a)).reshape(len(a), -1) for a in arrays]
    return np.array(
        [zlib.crc32(b"".join(r[i].tobytes() for r in rows)) for i in range(len(rows[0]))], np.uint32
    )


def padded_rows(n: int) -> int:
    """The batch size ``predict`` runs for n observations: the next power of two, so that a model
    compiles its acting step for a handful of sizes, not for every new n."""
    return 1 << max(0, int(n) - 1).bit_length()


def pad_rows(array: Any, rows: int) -> np.ndarray:
    """``array`` (n, ...) with its last row repeated up to ``rows`` rows."""
    array = np.asarray(array)
    extra = rows - array.shape[0]
    return array if extra == 0 else np.concatenate([array, np.repeat(array[-1:], extra, axis=0)])


def check_predict_args(deterministic: Any, episode_start: Any, n: int) -> np.ndarray | None:
    """Refuse a non-boolean ``deterministic`` and an ``episode_start`` that is not one flag per
    observation; return ``episode_start`` as an (n,) bool array (None when not given)."""
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(
            f"deterministic must be a bool, got {deterministic!r} ({type(deterministic).__name__}): "
            "a string such as 'False' would count as True."
        )
    if episode_start is None:
        return None
    starts = np.asarray(episode_start)
    if starts.size != n or starts.ndim > 1:
        raise ValueError(
            f"episode_start has shape {starts.shape}, expected ({n},): one flag per observation."
        )
    return starts.reshape(n).astype(bool)


def check_carried_state(state: Any, expected: dict[str, tuple[int, ...]], n: int) -> list[np.ndarray] | None:
    """``predict``'s ``state`` as float32 arrays of the ``expected`` shapes (None when not given);
    a state of other shapes, or holding NaN or inf, is refused."""
    if state is None:
        return None
    shapes = [np.shape(s) for s in state] if isinstance(state, (tuple, list)) else None
    if shapes != list(expected.values()):
        raise ValueError(
            f"state must be the ({', '.join(expected)}) tuple that predict returned, with shapes "
            f"{list(expected.values())} for {n} observations; got {shapes or type(state).__name__}."
        )
    carried = [np.asarray(s, np.float32) for s in state]
    check_finite_arrays(dict(zip(expected, carried, strict=True)), "state", STATE_FIX)
    return carried


class Predictor(AgentHooks, OffPolicyAlgorithm):
    """The shell's ``predict`` helpers and ``predict_rollout`` (an agent's ``predict`` uses them)."""

    policy: JaxPolicy
    _predict_calls: int  # predict calls that drew from the predict stream
    _stateless_predicts: int  # consecutive predict calls without state nor episode_start

    def _predict_batch(self, observation: Any) -> tuple[AgentObservation, bool]:
        """The observation(s) flattened for the agent, and whether they came as a batch."""
        if isinstance(observation, tuple) and len(observation) == 2 and isinstance(observation[1], dict):
            raise ValueError(
                "predict() got an (obs, info) tuple: pass only the observation returned by reset()."
            )
        vectorized = self.obs_adapter.is_batched(observation)
        if not vectorized:
            if isinstance(observation, dict):
                observation = {k: np.asarray(v)[None] for k, v in observation.items()}
            else:
                observation = np.asarray(observation)[None]
        return self.obs_adapter.convert(observation), vectorized

    def _predict_inputs(
        self,
        observation: Any,
        state: Any,
        episode_start: Any,
        deterministic: Any,
        warn_stateless: bool = True,
    ) -> tuple[AgentObservation, bool, list[np.ndarray], np.ndarray]:
        """The checked inputs of ``predict``: (flat observations (n, O), whether they were a batch, the
        carried state as float32 arrays (zeros when ``state`` is None), (n,) episode starts).
        ``warn_stateless`` counts the call for the stateless-``predict`` warning."""
        obs, vectorized = self._predict_batch(observation)
        n = observation_rows(obs)
        given_starts = check_predict_args(deterministic, episode_start, n)
        if warn_stateless:
            self._count_stateless_predict(state, episode_start)
        expected = self._predict_state_shapes(n)
        carried = check_carried_state(state, expected, n)
        if carried is None:
            return (
                obs,
                vectorized,
                [np.zeros(shape, np.float32) for shape in expected.values()],
                np.ones(n, bool),
            )
        return obs, vectorized, carried, np.zeros(n, bool) if given_starts is None else given_starts

    def _predict_keys(self, deterministic: bool, *inputs: np.ndarray) -> jax.Array:
        """(n, 2) keys for a ``predict`` call on n rows (:func:`predict_keys`, from this model's
        predict stream, which advances with every call that is not deterministic)."""
        if deterministic:
            return predict_keys(True, self.policy.state["predict_key"], 0, *inputs)
        keys = predict_keys(False, self.policy.state["predict_key"], self._predict_calls, *inputs)
        self._predict_calls += 1
        return keys

    def _env_actions(self, actions: np.ndarray, vectorized: bool) -> np.ndarray:
        """``predict``'s agent actions (n, A) as env actions, refused when not finite."""
        refuse_non_finite_actions(actions, " in predict")
        env_actions = self.action_adapter.to_env(actions)
        return env_actions if vectorized else np.asarray(env_actions[0])  # 0-d for one Discrete action

    def _count_stateless_predict(self, state: Any, episode_start: Any) -> None:
        """Warn once per model when ``predict`` is called a second time in a row with neither ``state``
        nor ``episode_start`` (evaluate_policy passes ``episode_start`` from its first call on)."""
        if state is not None or episode_start is not None:
            self._stateless_predicts = 0
            return
        self._stateless_predicts += 1
        if self._stateless_predicts == 2:
            warnings.warn(
                f"{type(self).__name__}.predict was called twice without `state`: the agent "
                f"{self.stateless_predict_consequence}. "
                "Pass the returned state back, with `episode_start`, as for sb3-contrib's RecurrentPPO "
                "(evaluate_policy does this).",
                stacklevel=4,
            )

    def predict_rollout(
        self, observation: Any, actions: Any, state: Any = None, episode_start: Any = None
    ) -> dict[str, np.ndarray]:
        """What the world model expects if ``actions`` are taken next, open loop (no sampling).

        :param observation: the observation ``predict`` gets now: one, or a batch (n, ...).
        :param actions: env actions from now on: (T,) for Discrete or (T, A) for Box for one
            observation, (n, T) or (n, T, A) for a batch; the first is typically the action ``predict``
            returns for ``observation``.
        :param state: what ``predict`` returned at the previous step (None at an episode's start),
            and ``episode_start`` as for ``predict``: a recurrent model (DreamerV3) predicts from the
            belief ``predict`` forms from them; a Markov one (TD-MPC2) from the observation alone.
        :return: the agent's predictions by name (its ``predict_rollout`` documentation), each with
            the n axis first, or without it for one observation.
        """
        return self._predict_rollout(observation, actions, state, episode_start, agent_units=False)

    def _predict_rollout(
        self, observation: Any, actions: Any, state: Any, episode_start: Any, agent_units: bool
    ) -> dict[str, np.ndarray]:
        obs, vectorized, carried, starts = self._predict_inputs(
            observation, state, episode_start, deterministic=True, warn_stateless=False
        )
        agent_actions = self._rollout_actions(actions, observation_rows(obs), vectorized, agent_units)
        out = self._open_loop(obs, agent_actions, carried, starts)
        return {k: (np.asarray(v) if vectorized else np.asarray(v)[0]) for k, v in out.items()}

    def _rollout_actions(self, actions: Any, n: int, vectorized: bool, agent_units: bool) -> np.ndarray:
        """Actions of :meth:`predict_rollout` (env units, or the agent's with ``agent_units``), with or
        without the env axis → agent actions (n, T, A) float32; a wrong shape is refused."""
        discrete = self.action_adapter.discrete and not agent_units
        event = () if discrete else (self.action_adapter.dim,)
        actions = np.asarray(actions) if discrete else np.asarray(actions, np.float32)
        given = actions.shape
        if not vectorized:
            actions = actions[None]
        if actions.ndim != 2 + len(event) or actions.shape[0] != n or actions.shape[2:] != event:
            expected = ", ".join(map(str, ((n,) if vectorized else ()) + ("T", *event)))
            raise ValueError(
                f"actions have shape {given}, expected ({expected}): the env axis first for a batch of "
                "observations, none for one observation."
            )
        if agent_units:
            return actions
        steps = actions.shape[1]
        flat = self.action_adapter.from_env(actions.reshape(n * steps, *event))
        return np.asarray(flat, np.float32).reshape(n, steps, -1)
