"""Evaluate the speed predictors on held-out traces: MAPE overall and around change points, as a table.

    python -m predictor.evaluate                       # the held-out test traces
    python -m predictor.evaluate --traces traces/hog_*.csv.gz --json out.json
    python -m predictor.evaluate --aggregate 16        # as if each step were 16 recorded steps long

Each predictor sees a trace step by step, exactly as in training: after step
t it observes the measured speed and telemetry and forecasts step t+1; the
error is |forecast - v_{t+1}| / v_{t+1}. "Change points" are the 10 steps
after each change of the injected state (quota, hog, memory) that the
recorder wrote into the trace. "oracle" knows the next step's injected state
and predicts the trace's median speed in that state: the error left when the
state change itself is known in advance. "noise" is no predictor either: the
centred median of the 9 steps around each step (it sees 4 steps ahead), whose
error is the size of each step's deviation from its local level, the part of
a step that no forecast made before it can know.
"""
import argparse
import json
import math
import os
import sys
import warnings

import numpy as np

from . import make_predictor
from .narx import load, load_default, model_path
from .traces import aggregate, read_trace

__all__ = ["forecasts", "evaluate", "main", "PREDICTOR_ROWS"]

CHANGE_WINDOW = 10
PREDICTOR_ROWS = ("last", "ema", "arx", "arx+online", "narx", "narx+online", "oracle", "noise")
NOISE_SPAN = 9
STATE = ("quota", "hog", "mem")


def _make(name, model_dir=None, device="cpu"):
    kind, _, online = name.partition("+")
    if kind in ("narx", "arx"):
        if model_dir:
            return load(model_path(kind, device, model_dir), online=bool(online))
        return load_default(kind, online=bool(online), device=device)
    return make_predictor(name)


def forecasts(predictor, trace):
    """f[t] = forecast of speed[t] made after step t-1 (f[0] = NaN)."""
    speed, features = trace["speed"], trace["features"]
    predictor.reset()
    out = np.full(speed.size, np.nan)
    for t in range(speed.size - 1):
        predictor.observe(speed[t], features[t])
        out[t + 1] = predictor.forecast()
    return out


def _states(trace):
    """(steps, 3) injected state (quota, hog, mem) of a trace; zeros where the recorder did not know it."""
    return np.column_stack([trace.get(k, np.zeros_like(trace["speed"])) for k in STATE])


def _oracle(trace):
    states = _states(trace)
    out = np.full(trace["speed"].size, np.nan)
    for state in np.unique(states, axis=0):
        mask = np.all(states == state, axis=1)
        out[mask] = np.median(trace["speed"][mask])
    return out


def _noise(trace):
    """Centred NOISE_SPAN-step median of the speed (edges: the part of the window that exists)."""
    speed = trace["speed"]
    half = NOISE_SPAN // 2
    padded = np.concatenate([np.full(half, np.nan), speed, np.full(half, np.nan)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, NOISE_SPAN)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-invalid window gives NaN, as intended
        return np.nanmedian(np.where(windows > 0, windows, np.nan), axis=1)


#: Rows that see the future (references, not predictors), and how each is computed from a trace.
REFERENCES = {"oracle": _oracle, "noise": _noise}


def _change_mask(trace):
    states = _states(trace)
    changes = np.flatnonzero(np.any(states[1:] != states[:-1], axis=1)) + 1
    mask = np.zeros(trace["speed"].size, dtype=bool)
    for c in changes:
        mask[c:c + CHANGE_WINDOW] = True
    return mask


def evaluate(paths, rows=PREDICTOR_ROWS, model_dir=None, steps=1, device="cpu"):
    """{predictor: {"steady", "dynamic", "change", "all": MAPE in %}} and per-trace figures; `steps` recorded
    steps are merged into one (predictor.traces.aggregate)."""
    errors = {name: {"steady": [], "dynamic": [], "change": []} for name in rows}
    per_trace = {}
    for path in paths:
        trace = aggregate(read_trace(path), steps)
        speed = trace["speed"]
        valid = np.isfinite(speed) & (speed > 0)
        valid[0] = False
        kind = "steady" if trace["name"].startswith("steady") else "dynamic"
        changes = _change_mask(trace) & valid
        per_trace[trace["name"]] = {"steps": int(valid.sum()), "changes": int(changes.sum())}
        for name in rows:
            f = REFERENCES[name](trace) if name in REFERENCES else forecasts(_make(name, model_dir, device), trace)
            err = np.abs(f - speed) / speed
            errors[name][kind].append(err[valid])
            errors[name]["change"].append(err[changes])
            per_trace[trace["name"]][name] = 100 * float(np.mean(err[valid]))
    table = {}
    for name in rows:
        table[name] = {}
        for key in ("steady", "dynamic", "change"):
            parts = errors[name][key]
            joined = np.concatenate(parts) if parts else np.zeros(0)
            table[name][key] = 100 * float(np.mean(joined)) if joined.size else float("nan")
        joined = np.concatenate(errors[name]["steady"] + errors[name]["dynamic"])
        table[name]["all"] = 100 * float(np.mean(joined)) if joined.size else float("nan")
    return table, per_trace


def format_table(table):
    lines = [f"{'predictor':<13}{'all':>8}{'steady':>9}{'dynamic':>9}{'change pts':>12}", "-" * 51]
    for name, row in table.items():
        cells = "".join(f"{row[k]:>{w}.2f}" if math.isfinite(row[k]) else f"{'-':>{w}}"
                        for k, w in (("all", 8), ("steady", 9), ("dynamic", 9), ("change", 12)))
        lines.append(f"{name:<13}{cells}")
    learned = [n for n in ("narx", "narx+online") if n in table]
    baselines = [n for n in ("last", "ema", "arx", "arx+online") if n in table]
    if learned and baselines:
        for key in ("dynamic", "steady", "change"):
            best = min(baselines, key=lambda n: table[n][key])
            ours = min(learned, key=lambda n: table[n][key])
            if math.isfinite(table[best][key]) and table[best][key] > 0:
                gain = 100 * (1 - table[ours][key] / table[best][key])
                lines.append(f"{key}: {ours} vs best baseline {best}: {gain:+.1f}% lower MAPE")
    return "\n".join(lines)


def main(argv=None):
    from .train import test_traces

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", nargs="*", help="trace files (default: the held-out test traces)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--model-dir", help="directory with narx_default.npz and arx_default.npz "
                                            "(default: the models shipped in predictor/models)")
    parser.add_argument("--aggregate", type=int, default=1, help="recorded steps merged into one (default 1)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="score the models for this device on its held-out traces (default cpu)")
    args = parser.parse_args(argv)
    if args.aggregate < 1:
        parser.error(f"--aggregate={args.aggregate} is not allowed: it must be >= 1")
    paths = args.traces or test_traces(device=args.device)
    missing = [p for p in paths if not os.path.exists(p)]
    if missing or not paths:
        parser.error(f"trace files not found: {missing or 'none given'}")
    table, per_trace = evaluate(paths, model_dir=args.model_dir, steps=args.aggregate, device=args.device)
    print(f"MAPE (%) of next-step speed forecasts on {len(paths)} held-out traces "
          f"({sum(v['steps'] for v in per_trace.values())} steps, "
          f"{sum(v['changes'] for v in per_trace.values())} at change points)")
    print(format_table(table))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"table": table, "traces": per_trace}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
