#!/usr/bin/env bash
# The main job: build the environment if needed, then compare every policy with plain Horovod on
# the static 1 : 1 : 0.5 : 0.25 scenario (4 workers, real cgroup CPU quotas where writable, emulated
# otherwise), 3 interleaved rounds, medians and spreads; then the same scenario with the MLP workload
# (a large gradient: the allreduce is a big part of the step) for the main contenders. About 30
# minutes on 2 cores. Tables, per-step CSVs and plots land in results/.
# Extra arguments go to both comparisons (e.g. --repeats 5).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2
.venv/bin/python -m benchmarks.compare --scenario static-4 --epochs 3 "$@"
exec .venv/bin/python -m benchmarks.compare --scenario static-4-mlp --epochs 3 \
    --variants horovod,equal,pid,pid-exact,lbbsp-ema,lbbsp-narx,lbbsp-narx-exact,oracle "$@"
