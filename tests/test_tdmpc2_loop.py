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

from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2
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
        step = self.num_timesteps
        action = super()._collect_act(last_obs, learning_starts)
        if step > self.seed_steps:
            self.events.append(("act", step, "planned", bool(self._rollout.first[0])))
        else:
            self.events.append(("act", step, "random", None))
        return action

    def _train_chunk(self, agent_state, k):
        step = self.num_timesteps - 1
        self.events.extend([("update", step, self.replay_buffer.num_episodes)] * k)
        return super()._train_chunk(agent_state, k)


def test_the_loop_follows_the_reference_step_by_step():
    length, seed_steps, steps = 7, 12, 40
    env = make_vec_env(lambda: TimeLimit(ChainEnv(length=100), length), n_envs=1, seed=0)
    settings = {k: v for k, v in SMOKE_SETTINGS.items() if k != "model_size"}
    model = RecordingTDMPC2(env, model_size=1, seed_steps=seed_steps, seed=0, **settings)
    model.learn(steps)
    expected = reference_loop(length, seed_steps, steps)
    assert model.events == expected
    # The transcription itself has the reference's shape: 12 updates at step 12, then one per step,
    # and the update of a step that ends an episode does not see that episode yet.
    updates = [e for e in expected if e[0] == "update"]
    assert len(updates) == seed_steps + (steps - 1 - seed_steps)
    assert ("update", 13, 1) in updates and ("update", 14, 2) in updates
    assert ("act", 14, "planned", True) in expected and ("act", 15, "planned", False) in expected
