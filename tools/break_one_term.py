"""Break one term of an update at a time and see which parity test catches it.

Each break is a one-line source change of the package (a loss scale, a normaliser, a stop-gradient,
the clip, a target, the schedule). For every break the package and tests are copied into a temporary
folder, the change is applied there (the checkout is never modified), and the agent's parity tests
run against the copy. A break that no test catches is a missing test.

    python tools/break_one_term.py                      # every break, both agents
    python tools/break_one_term.py --agent tdmpc2 --only clip
    python tools/break_one_term.py --markdown /tmp/breaks.md  # the table for docs/fidelity_checks.md

Writes a JSON record (``--out``) and, with ``--markdown``, the table that docs/fidelity_checks.md shows
(the file given is overwritten with the bare table).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Break:
    agent: str
    name: str
    what: str
    path: str
    old: str
    new: str


D_AGENT = "sb3_worldmodels/dreamerv3/agent.py"
D_NETS = "sb3_worldmodels/dreamerv3/networks.py"
T_AGENT = "sb3_worldmodels/tdmpc2/agent.py"
CONV = "sb3_worldmodels/blocks/convolution.py"

BREAKS = [
    # --- DreamerV3: loss scales, normaliser, stop-gradients, targets, schedule
    Break("dreamerv3", "rep_scale", "representation loss weighted like the dynamics loss (0.1 -> 1.0)",
          D_AGENT, '"rep": config.rep_scale,', '"rep": config.dyn_scale,'),
    Break("dreamerv3", "repval_scale", "replay-critic loss scale 0.3 -> 1.0",
          D_AGENT, '"repval": config.repval_scale,', '"repval": 1.0,'),
    Break("dreamerv3", "free_nats", "free nats removed from the dynamics loss",
          D_AGENT, '"dyn": free_nats(dyn_kl, config.free_nats),', '"dyn": dyn_kl,'),
    Break("dreamerv3", "rep_stop_gradient", "stop-gradient on the prior in the representation loss removed",
          D_AGENT, "categorical_kl(post, sg(prior)).sum(-1)", "categorical_kl(post, prior).sum(-1)"),
    Break("dreamerv3", "return_normaliser", "advantages not divided by the return scale",
          D_AGENT, "adv = sg((ret - value[:, :-1]) / ret_scale)", "adv = sg(ret - value[:, :-1])"),
    Break("dreamerv3", "retnorm_rate", "return-normaliser EMA rate doubled",
          D_AGENT, "percentile_norm_update(retnorm, ret, config.retnorm_rate)",
          "percentile_norm_update(retnorm, ret, 2 * config.retnorm_rate)"),
    Break("dreamerv3", "slowreg", "critic's regulariser toward the slow critic removed",
          D_AGENT, "critic_lp += config.slowreg * twohot_log_prob(critic_logits, slow_value, bins)",
          "critic_lp += 0.0 * twohot_log_prob(critic_logits, slow_value, bins)"),
    Break("dreamerv3", "actor_entropy", "actor entropy bonus removed",
          D_AGENT, "(log_pi * adv + config.actent * entropy)", "(log_pi * adv + 0.0 * entropy)"),
    Break("dreamerv3", "continue_target", "continue target without the discount (contdisc)",
          D_AGENT, 'con_logits, rows["cont"] * config.gamma)', 'con_logits, rows["cont"])'),
    Break("dreamerv3", "lambda", "imagined returns with lambda 1 instead of 0.95",
          D_AGENT, "imagined_lambda_return(img_reward, img_cont, sg(value), config.lam)",
          "imagined_lambda_return(img_reward, img_cont, sg(value), 1.0)"),
    Break("dreamerv3", "imagination_weight", "imagined losses not weighted by the cumulative continue",
          D_AGENT, "weight = sg(imagination_weight(img_cont))", "weight = sg(jnp.ones_like(img_cont))"),
    Break("dreamerv3", "slow_critic_copy", "slow critic not copied from the critic at the first update",
          D_AGENT, "config.slow_rate, state.updates == 0)", "config.slow_rate, state.updates < 0)"),
    Break("dreamerv3", "slow_critic_rate", "slow-critic EMA rate halved",
          D_AGENT, "ema_update(state.slow_critic, params[\"critic\"], config.slow_rate,",
          "ema_update(state.slow_critic, params[\"critic\"], 0.5 * config.slow_rate,"),
    Break("dreamerv3", "warmup", "learning-rate warmup read after the count is incremented",
          "sb3_worldmodels/blocks/optim.py", "jnp.clip(state.count.astype(jnp.float32) / warmup, 0.0, 1.0)",
          "jnp.clip((state.count + 1).astype(jnp.float32) / warmup, 0.0, 1.0)"),
    Break("dreamerv3", "agc_limit", "adaptive gradient clipping limit without the pmin floor",
          "sb3_worldmodels/blocks/optim.py", "limit = clip * jnp.maximum(pmin, param_norm)",
          "limit = clip * param_norm"),
    Break("dreamerv3", "pixel_offset", "image encoder input in [0, 1] instead of [-0.5, 0.5]",
          D_NETS, "* PIXEL_SCALE - 0.5", "* PIXEL_SCALE"),
    Break("dreamerv3", "decoder_space_layout", "image decoder's block-linear map without its block layout",
          D_NETS, "jnp.moveaxis(x0, -4, -2).reshape(", "x0.reshape("),
    Break("dreamerv3", "image_loss_scale", "image reconstruction loss weighted 0.5",
          D_AGENT, '"rec_image": config.rec_image_scale,', '"rec_image": 0.5 * config.rec_image_scale,'),
    Break("dreamerv3", "conv_input_grad_flip", "convolutions' input gradient with the kernel not flipped",
          CONV, "flipped = jnp.swapaxes(kernel[::-1, ::-1], 2, 3)", "flipped = jnp.swapaxes(kernel, 2, 3)"),
    Break("dreamerv3", "conv_block_taps", "convolutions' block kernel one input pixel off",
          CONV, "t = stride * p + i - low\n", "t = stride * p + i - low + 1\n"),
    # --- TD-MPC2: coefficients, targets, normaliser, clip, schedule
    Break("tdmpc2", "consistency_coef", "consistency loss coefficient 20 -> 10",
          T_AGENT, "config.consistency_coef * consistency", "0.5 * config.consistency_coef * consistency"),
    Break("tdmpc2", "rho", "temporal weights rho^t dropped from the reward and value losses",
          T_AGENT, "    rho = _rho(config, h)\n", "    rho = jnp.ones(h)\n"),
    Break("tdmpc2", "td_discount", "TD target without the discount",
          T_AGENT, "return reward + discount(config, task) * cont * q,", "return reward + cont * q,"),
    Break("tdmpc2", "td_stop_gradient", "the next latent of the consistency target not stop-gradiented",
          T_AGENT, "next_z = sg(N.encode(config, params, obs[1:], cond))",
          "next_z = (N.encode(config, params, obs[1:], cond))"),
    Break("tdmpc2", "running_scale", "policy loss not divided by the RunningScale",
          T_AGENT, "scaled = running_scale_apply(scale, q)", "scaled = q"),
    Break("tdmpc2", "running_scale_rate", "RunningScale EMA rate doubled",
          T_AGENT, "scale = running_scale_update(scale, q[0], config.tau)",
          "scale = running_scale_update(scale, q[0], 2 * config.tau)"),
    Break("tdmpc2", "world_model_clip", "world-model gradient clipping removed",
          T_AGENT, "lambda g: g * _clip_factor(grad_norm, config.grad_clip_norm), grads",
          "lambda g: g * 1.0, grads"),
    Break("tdmpc2", "policy_clip", "policy gradient clipping removed",
          T_AGENT, "clip = _clip_factor(pi_norm, config.grad_clip_norm)", "clip = jnp.ones_like(pi_norm)"),
    Break("tdmpc2", "stale_pi_grad", "the previous policy gradient left out of the world-model clip norm",
          T_AGENT, "stale = state.pi_grad_sq if config.stale_pi_grad_in_clip else 0.0", "stale = 0.0"),
    Break("tdmpc2", "encoder_lr", "encoder learning rate not scaled by 0.3",
          T_AGENT, '(config.enc_lr_scale if k == "encoder" else 1.0)', "1.0"),
    Break("tdmpc2", "target_tau", "target Qs updated with rate 2 tau",
          T_AGENT, "t + config.tau * (q - t)", "t + 2 * config.tau * (q - t)"),
    Break("tdmpc2", "entropy_coef", "policy entropy term removed",
          T_AGENT, "config.entropy_coef * log_pi - scaled", "0.0 * log_pi - scaled"),
]  # fmt: skip

TESTS = {
    "dreamerv3": [
        "tests/test_dreamerv3_parity.py",
        "tests/test_dreamerv3_parity_trained.py",
        "tests/test_dreamerv3_parity_images.py",
    ],
    "tdmpc2": ["tests/test_tdmpc2_parity.py", "tests/test_tdmpc2_parity_trained.py"],
}


def run_break(brk: Break | None, agent: str, timeout: int) -> dict:
    """Copy the package and tests, apply ``brk`` (None: the control run), run the agent's parity tests."""
    with tempfile.TemporaryDirectory(prefix="break-") as tmp:
        copy = Path(tmp)
        for part in ("sb3_worldmodels", "tests"):
            shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
        if brk is not None:
            source = copy / brk.path
            text = source.read_text()
            if text.count(brk.old) != 1:
                return {"error": f"the text to break occurs {text.count(brk.old)} times in {brk.path}"}
            source.write_text(text.replace(brk.old, brk.new))
        tests = [t for t in TESTS[agent] if (copy / t).exists()]
        # One compilation cache for all runs: the functions a break does not touch compile once.
        cache = Path(tempfile.gettempdir()) / "break-one-term-jax-cache"
        env = {**os.environ, "PYTHONPATH": str(copy), "JAX_COMPILATION_CACHE_DIR": str(cache)}
        env.update(
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0"
        )
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-rf", *tests]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        failed = sorted(set(re.findall(r"^FAILED (\S+?)(?: - |$)", proc.stdout, re.M)))
        summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
        return {
            "tests": tests,
            "failed": failed,
            "summary": summary,
            "seconds": round(time.perf_counter() - start, 1),
        }


def markdown(records: list[dict]) -> str:
    """One row per break: the tests (functions, parameters folded) that failed, and how many did."""
    lines = [
        "| agent | break | what was broken | failed tests | caught by |",
        "|---|---|---|---|---|",
    ]
    for r in records:
        tests = sorted({t.split("::")[-1].split("[")[0] for t in r.get("failed", [])})
        caught = ", ".join(f"`{t}`" for t in tests) or "**nothing: a missing test**"
        count = len(r.get("failed", []))
        lines.append(f"| {r['agent']} | `{r['name']}` | {r['what']} | {count} | {caught} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", choices=["dreamerv3", "tdmpc2"], default=None)
    parser.add_argument("--only", nargs="*", default=None, help="names of breaks to run")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/break_one_term.json")
    parser.add_argument("--markdown", type=Path, default=None, help="print the table to this file too")
    parser.add_argument("--timeout", type=int, default=1800)
    args = parser.parse_args()
    selected = [
        b for b in BREAKS if (args.agent in (None, b.agent)) and (args.only is None or b.name in args.only)
    ]
    records = []
    for agent in sorted({b.agent for b in selected}):
        control = run_break(None, agent, args.timeout)
        print(f"{agent} control: {control['summary']}", flush=True)
        if control.get("failed"):
            raise SystemExit(f"the unbroken {agent} parity tests fail: {control['failed']}")
        for brk in (b for b in selected if b.agent == agent):
            result = run_break(brk, agent, args.timeout)
            print(f"{agent} {brk.name}: {result.get('failed') or result}", flush=True)
            records.append({**dataclasses.asdict(brk), **result})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(records, indent=1))
    table = markdown(records)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
