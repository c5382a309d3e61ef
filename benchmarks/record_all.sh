#!/usr/bin/env bash
# Re-record the committed speed traces (needs root for the quota/mixed scenarios).
# Each trace also says in its own header how it was made. About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
rec() { "$py" -m benchmarks.record "$@"; }
rec --scenario steady --workload mlp --batch 64  --steps 4000 --seed 0  --out predictor/data/traces/steady_mlp_b64.csv.gz
rec --scenario steady --workload cnn --batch 32  --steps 3000 --seed 1  --out predictor/data/traces/steady_cnn_b32.csv.gz
rec --scenario quota  --workload mlp --batch 64  --steps 6000 --seed 2  --out predictor/data/traces/quota_mlp_b64.csv.gz
rec --scenario quota  --workload cnn --batch 32  --steps 4000 --seed 3  --out predictor/data/traces/quota_cnn_b32.csv.gz
rec --scenario quota  --workload mlp --batch 256 --steps 2500 --seed 4  --out predictor/data/traces/quota_mlp_b256.csv.gz
rec --scenario hog    --workload mlp --batch 128 --steps 5000 --seed 5  --out predictor/data/traces/hog_mlp_b128.csv.gz
rec --scenario hog    --workload cnn --batch 64  --steps 3000 --seed 6  --out predictor/data/traces/hog_cnn_b64.csv.gz
rec --scenario hog    --workload mlp --batch 32  --steps 6000 --seed 7  --out predictor/data/traces/hog_mlp_b32.csv.gz
rec --scenario memory --workload mlp --batch 64  --steps 4000 --seed 8  --out predictor/data/traces/memory_mlp_b64.csv.gz
rec --scenario memory --workload cnn --batch 32  --steps 3000 --seed 9  --out predictor/data/traces/memory_cnn_b32.csv.gz
rec --scenario mixed  --workload mlp --batch 32  --steps 6000 --seed 10 --out predictor/data/traces/mixed_mlp_b32.csv.gz
rec --scenario mixed  --workload cnn --batch 32  --steps 4000 --seed 11 --out predictor/data/traces/mixed_cnn_b32.csv.gz
rec --scenario mixed  --workload mlp --batch 128 --steps 5000 --seed 12 --out predictor/data/traces/mixed_mlp_b128.csv.gz
