#!/usr/bin/env bash
# The learning checks' seed groups that take hours on 2 CPU cores and minutes on an accelerator.
#
#   bash benchmarks/groups_on_accelerator.sh multitask pixels
#
# multitask: both single-task phases of the multi-task check (TD-MPC2 size 1 online on cartpole-balance
#   and reacher-easy, seed 0, their replays exported), then the offline multi-task model on the pooled
#   exports as a group of seeds 0-2 (benchmarks/tdmpc2_multitask_learning.py).
# pixels: TD-MPC2 cartpole-balance from 64x64 pixels, seeds 0-2 in one model
#   (benchmarks/tdmpc2_learning.py); each seed's env renders in a process of its own
#   (--env-processes), and each seed's final evaluation runs its 10 episodes on 10 envs at once, each
#   in a process of its own (--eval-envs 10 --eval-processes): the frames render in parallel.
# The scripts write their results to benchmarks/results/ and figures to docs/figures/; with
# RESULTS_TAR=<file.tgz> those are also packed into that one file after each check. Each check
# resumes from its checkpoints in benchmarks/results/checkpoints/ when run again; BUDGET_S=480 stops the
# pixel group before a segment or an evaluation that would end past 480 s (a host's command limit: run
# the same command again until it says "done": true). SMOKE=1 runs each
# script's --smoke settings instead (a minute or two on a CPU; results under checkpoints/smoke/).
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=()
if [ "${SMOKE:-0}" = 1 ]; then smoke=(--smoke); fi
budget=()
if [ -n "${BUDGET_S:-}" ]; then budget=(--budget-s "$BUDGET_S"); fi

pack() {
    if [ -n "${RESULTS_TAR:-}" ]; then
        tar -czf "$RESULTS_TAR" benchmarks/results/*.json docs/figures
    fi
}

for check in "$@"; do
    start=$SECONDS
    case "$check" in
        multitask)
            for task in cartpole-balance reacher-easy; do
                python benchmarks/tdmpc2_multitask_learning.py single --task "$task" "${smoke[@]}"
            done
            python benchmarks/tdmpc2_multitask_learning.py multi --seeds 0 1 2 "${smoke[@]}"
            ;;
        pixels)
            python benchmarks/tdmpc2_learning.py --task cartpole-balance-pixels --seeds 0 1 2 --eval-every 0 \
                --env-processes --eval-envs 10 --eval-processes "${smoke[@]}" "${budget[@]}"
            ;;
        *)
            echo "unknown check '$check': choose from multitask, pixels" >&2
            exit 2
            ;;
    esac
    echo "$check: $((SECONDS - start)) s"
    pack
done
