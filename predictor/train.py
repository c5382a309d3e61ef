"""Train the NARX model (and its linear ARX baseline) on recorded traces; write the shipped model files.

    python -m predictor.train                    # CPU workers: all CPU traces except the held-out test files
    python -m predictor.train --device gpu       # GPU workers: gpu_resnet50_vb and gpu_nvml_train
    python -m predictor.train --traces traces/quota_*.csv.gz --out-dir /tmp/models

The CPU models read the CPU and memory features, the GPU models those readings of
predictor.telemetry.FEATURES that move in their training traces (a reading
that never moves there carries nothing). The GPU models train on the
ResNet-50 trace with its batch drawn per step and on the first 70% of the
NVML trace; predictor.evaluate --device gpu scores the last 30%.

Both models see the same windows (predictor/features.py), use the same loss
(mean absolute error of the log speed ratio, which tracks MAPE), the same
optimizer and early stopping on the last 15% of every training trace. For
each, several window lengths (and GRU sizes) are tried; ARX keeps the lowest
validation loss, NARX the cheapest candidate within 5% of it (it runs at
every training step, so its cost counts). Held out for `predictor.evaluate`,
and no part of training or selection: TEST_TRACES by file, every trace of the
contention kinds in HELD_OUT_KINDS, and the live_* traces (see `held_out`).
Every recorded training trace is also seen aggregated (AGGREGATES).
"""
import argparse
import glob
import json
import logging
import os
import sys

import numpy as np

from .features import DEFAULT_SPEC, WindowSpec
from .narx import MODEL_DIR, ARXPredictor, NARXPredictor, model_path, save
from .telemetry import FEATURES
from .traces import TRACE_DIR, aggregate, list_traces, read_trace, trace_name

__all__ = ["TEST_TRACES", "GPU_TRAINING", "GPU_TEST", "QUICK", "held_out", "training_traces", "test_traces",
           "moving_features", "windows", "train", "main"]

log = logging.getLogger("predictor.train")

#: Configurations tried: NARX (delays, GRU units) and ARX delays.
NARX_CANDIDATES = ((8, 16), (16, 32))
ARX_CANDIDATES = (8, 16)
#: `train` options of --quick: one small NARX and ARX, two epochs (for tests of the commands).
QUICK = {"narx_candidates": ((4, 4),), "arx_candidates": (4,), "epochs": 2}
#: NARX runs at every step: the cheapest candidate within this fraction of the best validation loss wins.
SELECTION_SLACK = 0.05

#: Held out by file: one or more of every scenario, workloads and batch sizes not all seen in training, and
#: every trace of the contention kinds no training trace has (continuous quota walks, ramps, partial-duty
#: hogs), recorded with the batch drawn per step.
TEST_TRACES = ("steady_cnn_b32", "quota_mlp_b256", "hog_mlp_b32", "memory_cnn_b32", "mixed_cnn_b32")
HELD_OUT_KINDS = ("walk", "ramp", "duty")
#: Every training trace is also seen with this many recorded steps merged into one (predictor.traces.aggregate):
#: the same contention at the lower per-step noise of longer steps, so the model learns how much to smooth
#: from the window instead of assuming one noise level.
AGGREGATES = (1, 4, 16)


#: The GPU models' training and test traces (predictor.gpu_traces).
GPU_TRAINING = ("gpu_resnet50_vb", "gpu_nvml_train")
GPU_TEST = ("gpu_nvml_test",)


def held_out(name):
    """True for a trace that plays no part in training: TEST_TRACES, the held-out kinds, live_* traces."""
    return name in TEST_TRACES or name.startswith(("live_",) + tuple(f"{k}_" for k in HELD_OUT_KINDS))


def training_traces(directory=TRACE_DIR, device="cpu"):
    """The traces a device's models train on: every recorded CPU trace except the held-out ones (see
    `held_out`), or GPU_TRAINING."""
    names = [(p, trace_name(p)) for p in list_traces(directory)]
    if device == "gpu":
        return [p for p, name in names if name in GPU_TRAINING]
    return [p for p, name in names if not held_out(name) and not name.startswith("gpu_")]


def test_traces(directory=TRACE_DIR, device="cpu"):
    """What predictor.evaluate scores by default: the held-out recorded CPU traces (not the live_* ones), or
    GPU_TEST."""
    names = [(p, trace_name(p)) for p in list_traces(directory)]
    if device == "gpu":
        return [p for p, name in names if name in GPU_TEST]
    return [p for p, name in names if held_out(name) and not name.startswith(("live_", "gpu_"))]


def moving_features(paths):
    """The readings of FEATURES that move in the traces at `paths` (in FEATURES' order)."""
    spread = np.nanstd(np.concatenate([read_trace(p)["features"] for p in paths]), axis=0)
    return tuple(f for f, s in zip(FEATURES, spread) if s > 1e-9)


def windows(paths, spec, holdout=0.15, aggregates=AGGREGATES):
    """(X_train, y_train, X_val, y_val): windows of every trace at every aggregation, the last `holdout` of
    each for validation."""
    parts = {"train": ([], []), "val": ([], [])}
    for path in paths:
        recorded = read_trace(path)
        # Traces exported from live jobs already have a multi-process job's steps: they are used as they are.
        for steps in (1,) if recorded["name"].startswith("livetrain_") else aggregates:
            trace = aggregate(recorded, steps)
            X, y, ends = spec.dataset(trace["speed"], trace["features"])
            cut = ends < int(len(trace["speed"]) * (1 - holdout))
            for name, mask in (("train", cut), ("val", ~cut)):
                parts[name][0].append(X[mask])
                parts[name][1].append(y[mask])
    stack = [np.concatenate(parts[n][i]) for n in ("train", "val") for i in (0, 1)]
    return tuple(a.astype(np.float32) for a in stack)


def _fit(model, data, epochs):
    import tensorflow as tf

    X, y, Xv, yv = data
    model.compile(optimizer=tf.keras.optimizers.Adam(3e-3), loss="mae")
    stop = tf.keras.callbacks.EarlyStopping(patience=6, restore_best_weights=True)
    hist = model.fit(X, y, validation_data=(Xv, yv), batch_size=256, epochs=epochs, verbose=0, callbacks=[stop],
                     shuffle=True)
    return float(min(hist.history["val_loss"])), len(hist.history["loss"])


def _train_narx(data, spec, units, epochs):
    import tensorflow as tf

    layers = tf.keras.layers
    model = tf.keras.Sequential([layers.GRU(units, input_shape=(spec.delays, spec.width)), layers.Dense(1)])
    val, used = _fit(model, data, epochs)
    gru, dense = model.layers
    kernel, recurrent, bias = gru.get_weights()
    dense_w, dense_b = dense.get_weights()
    return NARXPredictor(spec, kernel, recurrent, bias, dense_w[:, 0], dense_b), val, used


def _train_arx(data, spec, epochs):
    import tensorflow as tf

    layers = tf.keras.layers
    model = tf.keras.Sequential([layers.Flatten(input_shape=(spec.delays, spec.width)), layers.Dense(1)])
    val, used = _fit(model, data, epochs)
    w, b = model.layers[1].get_weights()
    return ARXPredictor(spec, w[:, 0], b), val, used


def train(paths, narx_candidates=NARX_CANDIDATES, arx_candidates=ARX_CANDIDATES, epochs=60, seed=0,
          features=DEFAULT_SPEC.features, aggregates=AGGREGATES):
    """Train every candidate configuration; keep, for NARX and for ARX, the one with the lowest validation loss.

    Returns (narx, arx, report). Selection uses only the validation tail of the
    training traces, never the held-out test traces.
    """
    import tensorflow as tf

    report = {"traces": [os.path.basename(p) for p in paths], "features": list(features), "candidates": [],
              "selection": "lowest validation loss; for NARX the cheapest candidate within "
                           f"{SELECTION_SLACK:.0%} of it (it runs at every training step)"}
    trained = {"narx": [], "arx": []}
    cache = {}
    for kind, candidates in (("narx", narx_candidates), ("arx", arx_candidates)):
        for config in candidates:
            delays, units = (config if kind == "narx" else (config, None))
            spec = WindowSpec(delays, DEFAULT_SPEC.level_span, features)
            if delays not in cache:
                cache[delays] = windows(paths, spec, aggregates=aggregates)
                if len(cache[delays][0]) == 0:
                    raise ValueError(f"no usable windows in {len(paths)} traces: each needs > "
                                     f"{spec.history_needed} steps")
            tf.keras.utils.set_random_seed(seed)
            if kind == "narx":
                model, val, used = _train_narx(cache[delays], spec, units, epochs)
            else:
                model, val, used = _train_arx(cache[delays], spec, epochs)
            entry = {"kind": kind, "delays": delays, "units": units, "val_mae_log": val, "epochs": used,
                     "train_windows": int(len(cache[delays][0])), "val_windows": int(len(cache[delays][2]))}
            report["candidates"].append(entry)
            log.info("%s", entry)
            trained[kind].append((model, entry))
    best_arx = min(trained["arx"], key=lambda m: m[1]["val_mae_log"])
    lowest = min(entry["val_mae_log"] for _, entry in trained["narx"])
    good = [m for m in trained["narx"] if m[1]["val_mae_log"] <= (1 + SELECTION_SLACK) * lowest]
    best_narx = min(good, key=lambda m: m[1]["delays"] * m[1]["units"])
    report["narx"], report["arx"] = best_narx[1], best_arx[1]
    report["train_windows"] = best_narx[1]["train_windows"]
    return best_narx[0], best_arx[0], report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", nargs="*", help="trace files (default: the device's training traces)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="the workers the models are for")
    parser.add_argument("--out-dir", default=MODEL_DIR)
    parser.add_argument("--quick", action="store_true", help="one small NARX and ARX, few epochs (for testing)")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    paths = [p for pattern in args.traces for p in sorted(glob.glob(pattern))] if args.traces else \
        training_traces(device=args.device)
    if not paths:
        parser.error(f"no trace files match {args.traces!r}")
    # GPU steps are long and quiet: their traces are seen as they are, and with the readings that move there.
    options = dict(features=moving_features(paths), aggregates=(1,)) if args.device == "gpu" else {}
    narx, arx, report = train(paths, seed=args.seed, **(QUICK if args.quick else {"epochs": args.epochs}), **options)
    os.makedirs(args.out_dir, exist_ok=True)
    report["device"] = args.device
    save(narx, model_path("narx", args.device, args.out_dir), meta=report)
    save(arx, model_path("arx", args.device, args.out_dir), meta=report)
    log.info("%s", json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
