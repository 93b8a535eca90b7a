"""The loop around the jitted calls: ``learn``'s rate against the rate of its jitted calls alone.

    python benchmarks/loop_speed.py --agent tdmpc2                 # size 1, Pendulum-v1, 1 env
    python benchmarks/loop_speed.py --agent tdmpc2 --tiny          # the smoke sizes: calls of ~1 ms,
                                                                  # the loop's own cost in the open
    python benchmarks/loop_speed.py --agent dreamerv3              # "1m", CartPole-v1, 16 envs, 16x64,
                                                                  # train ratio 512
    python benchmarks/loop_speed.py --agent dreamerv3 --acting     # the acting path alone (no updates)
    PYTHONPATH=/tmp/other-checkout python benchmarks/loop_speed.py ...   # another commit, alternating

After a warm-up ``learn`` (every program compiled), each round times a ``learn`` window of
``--steps`` vector steps, then the same jitted calls alone on the model's own state and inputs: the
acting call and the training call, each waited for (``block_until_ready``) and timed ``--repeats``
times (medians), as ``tdmpc2_speed.py`` times plan and update. The window's jitted seconds are its
vector steps times the acting call plus its training calls times the training call; the ratio
``learn_rate / jitted_rate`` is the share of the calls' own rate that ``learn`` reaches (1.0: the
loop around them costs nothing, or hides behind them). ``chained`` is a loop of the calls alone
without the env (training call, acting call, the action fetched), as a loop with no host work
would run them. Many short rounds alternate learn and calls so that a busy neighbour on the CPU
affects both alike; the JSON line has every round, the medians over the rounds, ``ratio_all_rounds``
(every window's jitted seconds over every window's learn seconds), the CPU (model, vector
extensions), the load average and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from sb3_worldmodels import TDMPC2, DreamerV3  # noqa: E402
from sb3_worldmodels.blocks.cpu import cpu_info  # noqa: E402
from sb3_worldmodels.common.training import pad_updates, training_call, training_chunks  # noqa: E402
from sb3_worldmodels.dreamerv3 import agent as dreamer_core  # noqa: E402
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE  # noqa: E402
from sb3_worldmodels.tdmpc2 import agent as tdmpc2_core  # noqa: E402
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE  # noqa: E402

TDMPC2_SETTINGS = dict(model_size=1, seed_steps=250)
DREAMER_SETTINGS = dict(model_size="1m", batch_size=16, batch_length=64, train_ratio=512)


def build(agent: str, tiny: bool, acting: bool) -> Any:
    """The model after a warm-up ``learn`` that compiled its acting and training calls."""
    if agent == "tdmpc2":
        settings = {**TDMPC2_SMOKE, "seed_steps": 250} if tiny else dict(TDMPC2_SETTINGS)
        model = TDMPC2("Pendulum-v1", seed=0, **settings)
        model.learn(settings["seed_steps"] + 200 + 2)  # an episode has ended: plans and updates compiled
        return model
    settings = {**DREAMER_SMOKE} if tiny else dict(DREAMER_SETTINGS)
    if acting:
        settings["learning_starts"] = 10**9  # the policy step every vector step, never an update
    model = DreamerV3("CartPole-v1", n_envs=16, seed=0, **settings)
    model.learn(model.n_envs)
    while not acting and model._n_updates == 0:  # through the first training call (compiles it)
        model.learn(model.n_envs, reset_num_timesteps=False)
    return model


def agent_calls(model: Any) -> tuple[Any, Any]:
    """(the acting call, the training call) of ``model`` on its current state and inputs, each a
    function of no argument returning the call's outputs (not waited for)."""
    cfg, state = model._config, model.policy.state["agent"]
    obs, roll, key = model._flat_last_obs(), model._rollout, jax.random.PRNGKey(1)
    size = model._updates_per_call
    if isinstance(model, TDMPC2):
        core: Any = tdmpc2_core
        vector = obs["image"] if isinstance(obs, dict) else obs

        def act() -> Any:
            return core.act_jit(
                cfg, state.params, vector, roll.prev_mean, roll.first, key, deterministic=False
            )

    else:
        core = dreamer_core
        params = core.policy_params(state)

        def act() -> Any:
            return core.policy_step_jit(
                cfg, params, roll.carry, obs, roll.pending.is_first, key, deterministic=False
            )

    batch = pad_updates(model._training_batch(size).batch, size)
    count = None if size == 1 else np.int32(size)

    def train() -> Any:
        return training_call(core)(cfg, state, batch, count)

    return act, train


def median_seconds(call: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def chained_seconds(model: Any, steps: int, training_calls: int) -> float:
    """Seconds of ``steps`` acting calls and ``training_calls`` training calls in a loop with no host
    work besides them: each training call's state feeds the next acting call, each action fetched."""
    act, _ = agent_calls(model)
    size = model._updates_per_call
    batch = pad_updates(model._training_batch(size).batch, size)
    cfg, state = model._config, model.policy.state["agent"]
    count = None if size == 1 else np.int32(size)
    core = tdmpc2_core if isinstance(model, TDMPC2) else dreamer_core
    train = training_call(core)
    due = np.linspace(0, training_calls, steps + 1).astype(int)
    start = time.perf_counter()
    for i in range(steps):
        for _ in range(due[i + 1] - due[i]):
            state = train(cfg, state, batch, count)[0]
        np.asarray(act()[0])
    jax.block_until_ready(state)
    return time.perf_counter() - start


def learn_window(model: Any, steps: int) -> dict:
    """``learn`` for ``steps`` vector steps: its seconds, vector steps and training calls."""
    env, counts = model.get_env(), {"steps": 0, "calls": 0}
    step_wait, take = env.step_wait, model._take_owed_updates

    def counted_step() -> Any:
        counts["steps"] += 1
        return step_wait()

    def counted_take() -> int:
        owed = take()
        counts["calls"] += len(training_chunks(owed, model._updates_per_call)) if owed > 0 else 0
        return owed

    env.step_wait, model._take_owed_updates = counted_step, counted_take
    try:
        start = time.perf_counter()
        model.learn(steps * model.n_envs, reset_num_timesteps=False)
        seconds = time.perf_counter() - start
    finally:
        del env.step_wait, model._take_owed_updates  # the objects' own methods again
    return {"seconds": seconds, **counts}


def run(args: argparse.Namespace) -> dict:
    model = build(args.agent, args.tiny, args.acting)
    rounds = []
    for _ in range(args.rounds):
        window = learn_window(model, args.steps)
        act, train = agent_calls(model)
        act_s = median_seconds(act, args.repeats)
        train_s = median_seconds(train, args.repeats) if window["calls"] else 0.0
        jitted = window["steps"] * act_s + window["calls"] * train_s
        chained = chained_seconds(model, window["steps"], window["calls"])
        rounds.append(
            {
                "learn_steps_per_s": window["steps"] / window["seconds"],
                "jitted_steps_per_s": window["steps"] / jitted,
                "chained_steps_per_s": window["steps"] / chained,
                "ratio": jitted / window["seconds"],
                "act_ms": 1000 * act_s,
                "train_call_ms": 1000 * train_s,
                "training_calls": window["calls"],
                "vector_steps": window["steps"],
                "host_ms_per_step": 1000 * (window["seconds"] - jitted) / window["steps"],
            }
        )
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    # Over every round: the jitted calls' seconds of all windows against learn's seconds of all windows.
    learn_s = sum(r["vector_steps"] / r["learn_steps_per_s"] for r in rounds)
    jitted_s = sum(r["vector_steps"] / r["jitted_steps_per_s"] for r in rounds)
    overall = {"ratio_all_rounds": jitted_s / learn_s}
    unit = "agent" if args.agent == "tdmpc2" else "vector"
    if args.agent == "tdmpc2":
        what = "tiny (smoke sizes)" if args.tiny else "size 1"
        settings = f"{what}, Pendulum-v1, 1 env"
    else:
        what = "smoke sizes" if args.tiny else '"1m" 16x64 ratio 512'
        settings = f"{what}, CartPole-v1, 16 envs{', acting only (no updates)' if args.acting else ''}"
    return {
        "agent": args.agent,
        "settings": settings,
        "rate_unit": f"{unit} steps/s",
        "steps_per_round": args.steps,
        **{key: round(value, 3) for key, value in median.items()},
        **{key: round(value, 3) for key, value in overall.items()},
        "rounds": [{key: round(value, 3) for key, value in r.items()} for r in rounds],
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        **cpu_info().as_dict(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "package": str(Path(sys.modules["sb3_worldmodels"].__file__).parent),
        "date": datetime.date.today().isoformat(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agent", choices=("tdmpc2", "dreamerv3"), required=True)
    parser.add_argument(
        "--tiny", action="store_true", help="the smoke sizes: the loop's own cost in the open"
    )
    parser.add_argument("--acting", action="store_true", help="DreamerV3: the acting path alone, no updates")
    parser.add_argument("--steps", type=int, default=None, help="vector steps per learn window")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=None, help="timings of each call per round")
    args = parser.parse_args()
    slow = args.agent == "dreamerv3" and not (args.tiny or args.acting)
    args.steps = args.steps or (3 if slow else 25)
    args.repeats = args.repeats or (3 if slow else 15)
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
