"""TD-MPC2's training loop, step by step, against a transcription of the reference's online trainer.

The reference (``trainer/online_trainer.py:67-115@b67b21c``) runs, per agent step ``s``: on ``done``,
add the finished episode to the buffer (from the second episode on) and reset; act uniformly at
random while ``s <= seed_steps``, else plan with ``t0`` = "first step of the episode"; step the env;
then, from ``s == seed_steps`` on, update ``seed_steps`` times at that step and once per step after.
:func:`reference_loop` replays that control flow on a fixed-length episode and lists what happens;
the SB3 class must produce the same list: which steps are random or planned, the ``t0`` flags, how
many updates run at each step and how many finished episodes each update can sample from.
"""

from __future__ import annotations

import jax
import numpy as np
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2
from sb3_worldmodels.tdmpc2 import agent as core
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS
from tests.probe_envs import ChainEnv


def reference_loop(length: int, seed_steps: int, steps: int) -> list[tuple]:
    """The events of the reference's loop for episodes of ``length`` agent steps (see the module doc)."""
    events: list[tuple] = []
    episodes_in_buffer, done, entries, t = 0, True, 0, 0
    for step in range(steps):
        if done:
            if step > 0:
                episodes_in_buffer += 1  # self.buffer.add(torch.cat(self._tds))  (line 91)
            entries, t = 1, 0  # self._tds = [self.to_td(obs)]  (line 94)
        if step > seed_steps:
            events.append(("act", step, "planned", entries == 1))  # t0=len(self._tds)==1  (line 98)
        else:
            events.append(("act", step, "random", None))
        t += 1
        done = t >= length
        entries += 1
        if step >= seed_steps:
            for _ in range(seed_steps if step == seed_steps else 1):  # lines 105-112
                events.append(("update", step, episodes_in_buffer))
    return events


class RecordingTDMPC2(TDMPC2):
    """TDMPC2 that lists its loop's events in the form of :func:`reference_loop`."""

    def _setup_model(self) -> None:
        super()._setup_model()
        self.events: list[tuple] = []

    def _collect_act(self, last_obs, learning_starts):
        step = self.acting_step = self.num_timesteps
        action = super()._collect_act(last_obs, learning_starts)
        if step > self.seed_steps:
            self.events.append(("act", step, "planned", bool(self._rollout.first[0])))
        else:
            self.events.append(("act", step, "random", None))
        return action

    def _train_chunk(self, agent_state, k):
        # The updates of the step that acted last: made after its env step (the seed phase's burst),
        # or before it, while the env steps (every single update after the burst), from the same replay.
        self.events.extend([("update", self.acting_step, self.replay_buffer.num_episodes)] * k)
        self.before_step = getattr(self, "before_step", 0) + (self.num_timesteps == self.acting_step)
        return super()._train_chunk(agent_state, k)


def test_the_loop_follows_the_reference_step_by_step():
    length, seed_steps, steps = 7, 12, 40
    env = make_vec_env(lambda: TimeLimit(ChainEnv(length=100), length), n_envs=1, seed=0)
    settings = {k: v for k, v in SMOKE_SETTINGS.items() if k != "model_size"}
    model = RecordingTDMPC2(env, model_size=1, seed_steps=seed_steps, seed=0, **settings)
    model.learn(steps)
    expected = reference_loop(length, seed_steps, steps)
    assert model.events == expected
    assert model.before_step == steps - 1 - seed_steps  # the single updates, after the burst's step
    # The transcription itself has the reference's shape: 12 updates at step 12, then one per step,
    # and the update of a step that ends an episode does not see that episode yet.
    updates = [e for e in expected if e[0] == "update"]
    assert len(updates) == seed_steps + (steps - 1 - seed_steps)
    assert ("update", 13, 1) in updates and ("update", 14, 2) in updates
    assert ("act", 14, "planned", True) in expected and ("act", 15, "planned", False) in expected


class StopAt(BaseCallback):
    """Stops ``learn`` at the callback call of the vector step that reaches ``at`` agent steps."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def _on_step(self) -> bool:
        return self.model.num_timesteps < self.at


def test_a_run_stopped_at_a_step_drops_that_steps_update():
    """The update of a step after the burst is dispatched before the step's env step; a callback that
    stops ``learn`` at that step leaves the model as a run that ended one step earlier: the same
    parameters, updates and replay draws (the update is dropped, its batch's draws undone)."""
    settings = {k: v for k, v in SMOKE_SETTINGS.items() if k != "model_size"}

    def build() -> TDMPC2:
        env = make_vec_env(lambda: TimeLimit(ChainEnv(length=100), 7), n_envs=1, seed=0)
        return TDMPC2(env, model_size=1, seed_steps=12, seed=0, **settings)

    stopped, ended = build(), build()
    stopped.learn(40, callback=StopAt(30))  # steps 0..29; step 29's update is dropped
    ended.learn(29)  # steps 0..28, each with its updates
    assert stopped.num_timesteps == 30 and ended.num_timesteps == 29
    assert stopped._n_updates == ended._n_updates == 12 + (28 - 12)
    same = jax.tree_util.tree_map(np.array_equal, stopped.policy.state["agent"], ended.policy.state["agent"])
    assert all(jax.tree_util.tree_leaves(same))
    draws = stopped.replay_buffer.rng.bit_generator.state, ended.replay_buffer.rng.bit_generator.state
    assert draws[0] == draws[1]


def test_the_seed_phase_acts_from_the_collection_key_stream():
    """Every acting call, the seed phase's uniform actions too, takes the next key of the collection
    stream: ``act_key, step = split(act_key)`` per vector step, as an eager split before the call."""
    settings = {k: v for k, v in SMOKE_SETTINGS.items() if k != "model_size"}
    env = make_vec_env(lambda: TimeLimit(ChainEnv(length=100), 7), n_envs=2, seed=0)
    model = TDMPC2(env, model_size=1, seed_steps=10, seed=0, **settings)
    key, actions = model.policy.state["act_key"], []
    collect_act = model._collect_act
    model._collect_act = lambda obs, starts: actions.append(collect_act(obs, starts)) or actions[-1]
    model.learn(6)
    assert len(actions) == 3
    for action in actions:
        key, step = jax.random.split(key)
        assert np.array_equal(action, np.asarray(core.random_actions(step, 2, model._config.action_dim)))
    assert np.array_equal(np.asarray(model.policy.state["act_key"]), np.asarray(key))
