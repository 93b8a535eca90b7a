"""The loop around the jitted calls: ``learn``'s rate against the rate of its jitted calls alone.

    python benchmarks/loop_speed.py --agent tdmpc2                 # size 1, Pendulum-v1, 1 env
    python benchmarks/loop_speed.py --agent tdmpc2 --size 5        # TD-MPC2's size 5 (or 19, 48, 317)
    python benchmarks/loop_speed.py --agent tdmpc2 --tiny          # the smoke sizes: calls of ~1 ms,
                                                                  # the loop's own cost in the open
    python benchmarks/loop_speed.py --agent dreamerv3              # "1m", CartPole-v1, 16 envs, 16x64,
                                                                  # train ratio 512
    python benchmarks/loop_speed.py --agent dreamerv3 --acting     # the acting path alone (no updates)
    PYTHONPATH=/tmp/other-checkout python benchmarks/loop_speed.py ...   # another commit, alternating

After a warm-up ``learn`` (every program compiled), each round times a ``learn`` window of
``--steps`` vector steps (the steady loop: from the first step's callback call to the last's, without
``learn``'s own set-up and end, reported apart as ``learn_rest_ms``), then the same jitted calls
alone on the model's own state and inputs: the
acting call and the training call, each waited for (``block_until_ready``) and timed ``--repeats``
times (medians), as ``tdmpc2_speed.py`` times plan and update. The window's jitted seconds are its
vector steps times the acting call plus its updates times the training call's share per update (a
call runs as many of its K updates as are owed); the ratio
``learn_rate / jitted_rate`` is the share of the calls' own rate that ``learn`` reaches (1.0: the
loop around them costs nothing, or hides behind them). ``chained`` is a loop of the calls alone
without the env (training call, acting call, the action fetched), as a loop with no host work
would run them. Many short rounds alternate learn and calls so that a busy neighbour on the CPU
affects both alike; the JSON line has every round, the medians over the rounds, ``ratio_all_rounds``
(every window's jitted seconds over every window's learn seconds; ``chained_ratio_all_rounds`` the
same with the chained loop's seconds), the CPU (model, vector extensions), the load average and the
date.
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

from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402

from sb3_worldmodels import TDMPC2, DreamerV3  # noqa: E402
from sb3_worldmodels.blocks.cpu import cpu_info  # noqa: E402
from sb3_worldmodels.common.training import pad_updates, training_call, training_chunks  # noqa: E402
from sb3_worldmodels.dreamerv3 import agent as dreamer_core  # noqa: E402
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE  # noqa: E402
from sb3_worldmodels.tdmpc2 import agent as tdmpc2_core  # noqa: E402
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE  # noqa: E402

TDMPC2_SETTINGS = dict(model_size=1, seed_steps=250)
DREAMER_SETTINGS = dict(model_size="1m", batch_size=16, batch_length=64, train_ratio=512)


def build(
    agent: str,
    tiny: bool,
    acting: bool,
    size: int = 1,
    precision: str | None = None,
    compute_dtype: str | None = None,
) -> Any:
    """The model after a warm-up ``learn`` that compiled its acting and training calls
    (``precision``: its ``matmul_precision``, ``compute_dtype`` its compute dtype, else the defaults)."""
    numerics: dict[str, str] = {} if precision is None else {"matmul_precision": precision}
    if compute_dtype is not None:
        numerics["compute_dtype"] = compute_dtype
    if agent == "tdmpc2":
        settings = {**TDMPC2_SMOKE, "seed_steps": 250} if tiny else {**TDMPC2_SETTINGS, "model_size": size}
        model = TDMPC2("Pendulum-v1", seed=0, **settings, **numerics)
        model.learn(settings["seed_steps"] + 200 + 2)  # an episode has ended: plans and updates compiled
        return model
    settings = {**DREAMER_SMOKE} if tiny else dict(DREAMER_SETTINGS)
    if acting:
        settings["train_fill"] = 10**9  # the policy acts every vector step, and never trains
    model = DreamerV3("CartPole-v1", n_envs=16, seed=0, **settings, **numerics)
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

    if model._n_updates == 0:  # the acting path alone
        return act, None
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


def chained_seconds(model: Any, owed: list[int]) -> float:
    """Seconds of the window's calls in a loop with no host work besides them: per vector step, its
    ``owed`` updates in training calls as ``learn`` makes them (each call's state feeds the next
    call), then an acting call whose action is fetched."""
    act, _ = agent_calls(model)
    size = model._updates_per_call
    cfg, state = model._config, model.policy.state["agent"]
    core = tdmpc2_core if isinstance(model, TDMPC2) else dreamer_core
    train = training_call(core)
    batch = pad_updates(model._training_batch(size).batch, size) if any(owed) else None
    start = time.perf_counter()
    for updates in owed:
        for k in training_chunks(updates, size) if updates > 0 else ():
            state = train(cfg, state, batch, None if size == 1 else np.int32(k))[0]
        np.asarray(act()[0])
    jax.block_until_ready(state)
    return time.perf_counter() - start


class StepClock(BaseCallback):
    """The time of every vector step's callback call (SB3's ``on_step``, right after the env step)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def _on_step(self) -> bool:
        self.times.append(time.perf_counter())
        return True


def learn_window(model: Any, steps: int) -> dict:
    """``learn`` for ``steps`` vector steps: the steady loop's seconds (from the first step's callback
    call to the last's: ``steps - 1`` whole periods of act, env step, records and training, without
    learn's set-up and end), those vector steps, the updates of each, and the rest of the ``learn``
    call (its set-up and end)."""
    clock, taken = StepClock(), []
    take = model._take_owed_updates

    def counted_take() -> int:
        owed = take()
        taken.append((len(clock.times), owed))  # the training of the step whose callback came last
        return owed

    model._take_owed_updates = counted_take
    try:
        start = time.perf_counter()
        model.learn(steps * model.n_envs, reset_num_timesteps=False, callback=clock)
        seconds = time.perf_counter() - start
    finally:
        del model._take_owed_updates  # the object's own method again
    times = clock.times
    owed = [0] * (len(times) - 1)  # period i: after step i's callback, through step i + 1's
    for step, count in taken:
        if 1 <= step < len(times):
            owed[step - 1] += max(count, 0)
    steady = times[-1] - times[0]
    return {
        "seconds": steady,
        "steps": len(times) - 1,
        "owed": owed,
        "learn_rest_ms": 1000 * (seconds - steady * len(times) / (len(times) - 1)),
    }


def run(args: argparse.Namespace) -> dict:
    model = build(args.agent, args.tiny, args.acting, args.size, args.matmul_precision, args.compute_dtype)
    rounds = []
    for _ in range(args.rounds):
        window = learn_window(model, args.steps)
        act, train = agent_calls(model)
        updates = sum(window["owed"])
        act_s = median_seconds(act, args.repeats)
        train_s = median_seconds(train, args.repeats) if updates and train else 0.0
        # A call of k of its K updates runs k (its loop's trip count): k / K of a full call.
        jitted = window["steps"] * act_s + updates * train_s / model._updates_per_call
        chained = chained_seconds(model, window["owed"])
        rounds.append(
            {
                "learn_steps_per_s": window["steps"] / window["seconds"],
                "jitted_steps_per_s": window["steps"] / jitted,
                "chained_steps_per_s": window["steps"] / chained,
                "ratio": jitted / window["seconds"],
                "act_ms": 1000 * act_s,
                "train_call_ms": 1000 * train_s,
                "updates_per_call": model._updates_per_call,
                "updates": updates,
                "vector_steps": window["steps"],
                "host_ms_per_step": 1000 * (window["seconds"] - jitted) / window["steps"],
                "learn_rest_ms": window["learn_rest_ms"],
            }
        )
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    # Over every round: the jitted calls' seconds of all windows against learn's seconds of all windows.
    learn_s = sum(r["vector_steps"] / r["learn_steps_per_s"] for r in rounds)
    jitted_s = sum(r["vector_steps"] / r["jitted_steps_per_s"] for r in rounds)
    chained_s = sum(r["vector_steps"] / r["chained_steps_per_s"] for r in rounds)
    overall = {"ratio_all_rounds": jitted_s / learn_s, "chained_ratio_all_rounds": chained_s / learn_s}
    unit = "agent" if args.agent == "tdmpc2" else "vector"
    if args.agent == "tdmpc2":
        what = "tiny (smoke sizes)" if args.tiny else f"size {args.size}"
        settings = f"{what}, Pendulum-v1, 1 env"
    else:
        what = "smoke sizes" if args.tiny else '"1m" 16x64 ratio 512'
        settings = f"{what}, CartPole-v1, 16 envs{', acting only (no updates)' if args.acting else ''}"
    if args.matmul_precision is not None:
        settings += f", matmul_precision={args.matmul_precision}"
    if args.compute_dtype is not None:
        settings += f", compute_dtype={args.compute_dtype}"
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
    parser.add_argument("--size", type=int, default=1, help="TD-MPC2's model size (1, 5, 19, 48, 317)")
    parser.add_argument(
        "--matmul-precision", default=None, help="the model's matmul_precision (default: the agent's)"
    )
    parser.add_argument(
        "--compute-dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="the model's compute_dtype (default: the agent's)",
    )
    parser.add_argument("--steps", type=int, default=None, help="vector steps per learn window")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=None, help="timings of each call per round")
    args = parser.parse_args()
    slow = args.agent == "dreamerv3" and not (args.tiny or args.acting)
    args.steps = args.steps or (4 if slow else 40)
    args.repeats = args.repeats or (3 if slow else 15)
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
