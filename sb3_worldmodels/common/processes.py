"""One model trained by several processes (``jax.distributed``): what the shell does when a
``data_parallel=True`` model's devices belong to more than one process.

Every process builds the same model (same seed and hyperparameters: checked when it is built) and
runs the same ``learn``. Each steps its own envs, seeded ``seed + process_index * n_envs`` (its
acting keys and replay sampling its own too), and fills its own replay. Every update runs on the
global batch: ``batch_size`` rows, ``batch_size / P`` of them (for P processes of equal device
counts) sampled by each process from its replay, the parameters replicated on every device. After
each vector step the processes agree, in one all-gather of three integers, on

- the step count: ``num_timesteps`` advances as process 0's (DreamerV3 also counts episode ends,
  which differ between processes), so that every process makes as many vector steps and training
  calls;
- going on: a callback that stops ``learn`` in one process stops it in every process;
- the updates to run: the fewest that any process's schedule owes now (the others keep the rest
  owed).

Acting and ``predict`` read this process's copy of the parameters on its first device and run there
alone, without the other processes.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

from sb3_worldmodels.blocks import distributed
from sb3_worldmodels.blocks.devices import BatchPlacement
from sb3_worldmodels.common.agent_hooks import AgentHooks
from sb3_worldmodels.common.policy import JaxPolicy


class ProcessSpan(AgentHooks, OffPolicyAlgorithm):
    """The shell's part of a data-parallel run over several processes (see the module docstring)."""

    policy: JaxPolicy
    data_parallel: bool
    _batch_placement: BatchPlacement | None
    _run_updates: int
    """Updates the processes agreed to run at the next training call."""
    _local_view: tuple[Any, Any] | None
    """(the agent state, its copy on this process's first device), for acting and predict."""

    @property
    def _spans_processes(self) -> bool:
        """Whether the training batch is split over the devices of several processes."""
        placement = getattr(self, "_batch_placement", None)
        return placement is not None and placement.process_count > 1

    def _process_offset(self) -> int:
        """How far this process's env seeds are from the model's: ``process_index * n_envs`` in a
        data-parallel run over several processes, else 0."""
        if not getattr(self, "data_parallel", False) or jax.process_count() == 1:
            return 0
        return jax.process_index() * int(self.n_envs)

    def _collection_seed(self) -> int:
        """The seed of this process's collection (its replay's sampling, random actions): the model's
        seed (0 when None) moved by :meth:`_process_offset`."""
        return (0 if self.seed is None else int(self.seed)) + self._process_offset()

    def set_random_seed(self, seed: int | None = None) -> None:
        """SB3's seeding; in a run over several processes, this process's envs and action space are
        seeded ``seed + process_index * n_envs`` (every process steps other episodes)."""
        super().set_random_seed(seed)
        offset = self._process_offset()
        if seed is None or not offset:
            return
        self.action_space.seed(int(seed) + offset)
        if self.env is not None:
            self.env.seed(int(seed) + offset)

    def _step_key(self, key: jax.Array) -> jax.Array:
        """This process's acting key of a vector step (the step's key folded with the process index
        in processes other than 0)."""
        placement = self._batch_placement
        if placement is None or placement.process_index == 0:
            return key
        return jax.random.fold_in(key, placement.process_index)

    def _check_process_span(self) -> None:
        """Raise when the processes of a data-parallel run did not build the same model."""
        if not self._spans_processes:
            return
        rates = tuple(float(self.lr_schedule(progress)) for progress in (1.0, 0.5, 0.0))
        distributed.refuse_different_settings(
            {
                "algorithm": type(self).__name__,
                "seed": self.seed,
                "n_envs": self.n_envs,
                "batch_size": self.batch_size,
                "learning_starts": self.learning_starts,
                "learning_rate": rates,
                "the agent's configuration": self._config,
            },
            "models",
        )

    def _warn_lone_process(self) -> None:
        """Say that a model without ``data_parallel`` trains alone in a run of several processes."""
        if getattr(self, "data_parallel", False) or jax.process_count() == 1:
            return
        warnings.warn(
            f"This process is one of {jax.process_count()} of a jax.distributed run, but the model has "
            "data_parallel=False: it trains on this process's devices alone, apart from the other "
            "processes. Pass data_parallel=True for one model over every process's devices.",
            stacklevel=4,
        )

    # ------------------------------------------------------------------ per vector step
    def _agree_on_step(self, rows: int, go_on: bool) -> bool:
        """After a vector step that advanced this process's ``num_timesteps`` by ``rows``: the
        processes' agreement (module docstring). Returns whether every process goes on."""
        ready = self._take_owed_updates() if go_on else 0
        self._owed_updates += ready  # taken only to learn how many could run now
        agreed = distributed.agree([rows, int(go_on), ready])
        self.num_timesteps += int(agreed[0, 0]) - rows
        self._run_updates = int(agreed[:, 2].min())
        return bool(agreed[:, 1].all())

    def _take_run_updates(self) -> int:
        """The updates to run now (and forget them): those the schedule owes, or in a run over
        several processes those the processes agreed on after the last vector step."""
        if not self._spans_processes:
            return self._take_owed_updates()
        count, self._run_updates = getattr(self, "_run_updates", 0), 0
        self._owed_updates -= count
        return count

    # ------------------------------------------------------------------ the parameters
    def _local_agent_state(self) -> Any:
        """The agent state for acting and predict: with ``data_parallel`` over several devices, its
        copy on this process's first device (nothing is copied; one view per state), else itself."""
        state = self.policy.state["agent"]
        placement = getattr(self, "_batch_placement", None)
        if placement is None:
            return state
        view = getattr(self, "_local_view", None)
        if view is None or view[0] is not state:
            view = (state, placement.on_first_device(state))
            self._local_view = view
        return view[1]

    @property
    def _local_batch_size(self) -> int:
        """The rows of each training batch that this process samples from its replay."""
        batch_size = int(self._config.batch_size)
        placement = self._batch_placement
        return batch_size if placement is None else placement.local_batch_size(batch_size)
