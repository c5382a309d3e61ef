#!/usr/bin/env bash
# Re-record the committed speed traces (needs root for the quota/mixed scenarios).
# Each trace also says in its own header how it was made. About 25 minutes on 2 cores.
# The *_vb traces draw the batch per step (--batch-range); walk, ramp and duty are held out from training
# (predictor.train.HELD_OUT_KINDS): contention the training traces do not have.
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
rec --scenario quota  --workload conv --batch-range 16,160 --steps 3000 --seed 13 --out predictor/data/traces/quota_conv_vb.csv.gz
rec --scenario hog    --workload mlp  --batch-range 16,256 --steps 12000 --seed 14 --min-hold 0.3 --max-hold 2 --out predictor/data/traces/hog_mlp_vb.csv.gz
rec --scenario mixed  --workload conv --batch-range 16,160 --steps 3000 --seed 15 --out predictor/data/traces/mixed_conv_vb.csv.gz
rec --scenario memory --workload mlp  --batch-range 16,256 --steps 12000 --seed 16 --min-hold 0.3 --max-hold 2 --out predictor/data/traces/memory_mlp_vb.csv.gz
rec --scenario walk   --workload conv --batch-range 16,160 --steps 2500 --seed 17 --out predictor/data/traces/walk_conv_vb.csv.gz
rec --scenario walk   --workload mlp  --batch-range 16,256 --steps 12000 --seed 18 --min-hold 0.3 --max-hold 2 --out predictor/data/traces/walk_mlp_vb.csv.gz
rec --scenario ramp   --workload conv --batch-range 16,160 --steps 2500 --seed 19 --out predictor/data/traces/ramp_conv_vb.csv.gz
rec --scenario duty   --workload mlp  --batch-range 16,256 --steps 12000 --seed 20 --min-hold 0.3 --max-hold 2 --out predictor/data/traces/duty_mlp_vb.csv.gz
rec --scenario duty   --workload conv --batch-range 16,160 --steps 2500 --seed 21 --out predictor/data/traces/duty_conv_vb.csv.gz
