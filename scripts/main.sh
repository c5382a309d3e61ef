#!/usr/bin/env bash
# The main job: build the environment if needed, then run the short comparison of every policy on
# the static 1 : 1 : 0.5 : 0.25 scenario (4 workers on this machine, real cgroup CPU quotas where
# writable, emulated otherwise) and print the table; results and plots land in results/.
# Extra arguments go to benchmarks.compare (e.g. --scenario dynamic-2, --epochs 6).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/python -m benchmarks.compare --scenario static-4 --epochs 3 "$@"
