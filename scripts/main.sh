#!/usr/bin/env bash
# The main job: build the environment if needed, then plain Horovod against lbbsp on static-4-digits
# (four workers at 1 : 1 : 0.5 : 0.25 of a core through cgroup CPU quotas where writable, emulated
# otherwise; a CNN on scikit-learn's digits, scaled up 3x), 3 interleaved rounds: epoch times (medians and
# spreads), speedups and final accuracies, a plot and per-step CSVs in results/. About 7 minutes on
# 2 cores (README). `--full` runs the full suite instead (every policy on static-4 and static-4-mlp,
# about 30 minutes). Other arguments go to benchmarks.compare (e.g. --repeats 5).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2
if [ "${1:-}" = --full ]; then
  shift
  .venv/bin/python -m benchmarks.compare --scenario static-4 --epochs 3 "$@"
  exec .venv/bin/python -m benchmarks.compare --scenario static-4-mlp --epochs 3 \
      --variants horovod,equal,pid,pid-q8,lbbsp-ema,lbbsp-narx,lbbsp-narx-q8,oracle "$@"
fi
exec .venv/bin/python -m benchmarks.compare --scenario static-4-digits --repeats 3 \
    --variants horovod,pid,lbbsp-narx "$@"
