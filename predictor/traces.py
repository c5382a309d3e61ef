"""Reading and writing speed traces: per-step CSV (optionally gzip) of measured speed plus telemetry.

Columns: step, time, batch, step_time, speed, the telemetry FEATURES, and the
injected state where the recorder knows it (quota, hog, mem). Lines starting
with '#' hold how the trace was made. `speed` is the batch-free speed the
predictors forecast: samples/s for traces recorded at one batch size
(benchmarks.record, where it is proportional to the batch-free speed);
(b + k) / t for traces recorded with a batch drawn per step (*_vb, k fitted
over the trace and written in its header); and (b + k) / t with the job's
fitted fixed cost k for traces exported from live lbbsp jobs, whose batch
changes from step to step (benchmarks.export_traces: live_* are held out
for evaluation, livetrain_* are training data).
"""
import csv
import gzip
import io
import os

import numpy as np

from .telemetry import FEATURES, NEUTRAL

__all__ = ["COLUMNS", "write_trace", "read_trace", "trace_name", "to_rows", "cut", "list_traces", "aggregate",
           "TRACE_DIR"]

COLUMNS = ("step", "time", "batch", "step_time", "speed") + FEATURES + ("quota", "hog", "mem")
TRACE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "traces")


def _open(path, mode):
    return gzip.open(path, mode + "t", newline="") if str(path).endswith(".gz") else open(path, mode, newline="")


def write_trace(path, rows, comments=()):
    """Write dict rows (keys in COLUMNS) with a few significant digits, to keep committed traces small."""
    with _open(path, "w") as fh:
        for line in comments:
            fh.write(f"# {line}\n")
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([f"{row.get(c, float('nan')):.5g}" if isinstance(row.get(c), float) else row.get(c, "")
                             for c in COLUMNS])


def read_trace(path):
    """{"speed": (n,), "features": (n, len(FEATURES)), other columns: (n,), "comments": [...], "name": str}."""
    with _open(path, "r") as fh:
        text = fh.read()
    comments = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("#")]
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    reader = csv.reader(io.StringIO(body))
    header = next(reader)
    if "speed" not in header:
        raise ValueError(f"trace {path!r} lacks the column 'speed'")
    table = np.array([[float(v) if v != "" else np.nan for v in row] for row in reader if row], dtype=np.float64)
    table = table.reshape(-1, len(header))
    cols = {name: table[:, i] for i, name in enumerate(header)}
    out = {name: cols[name] for name in header if name not in FEATURES}
    # A reading the trace was recorded without (GPU readings on a CPU worker, and back) is neutral.
    out["features"] = np.column_stack([cols[f] if f in cols else np.full(len(table), NEUTRAL[i])
                                       for i, f in enumerate(FEATURES)]) if len(table) else \
        np.zeros((0, len(FEATURES)))
    out["comments"] = comments
    out["name"] = trace_name(path)
    return out


def trace_name(path):
    """A trace's name: its file name without the extensions (what held-out and training sets are chosen by)."""
    return os.path.basename(str(path)).split(".")[0]


def to_rows(trace):
    """The dict rows of a trace from `read_trace` (or `cut`), as `write_trace` takes them."""
    columns = [c for c in COLUMNS if c not in FEATURES and c in trace]
    rows = []
    for i in range(trace["speed"].size):
        row = {c: float(trace[c][i]) for c in columns}
        row.update(zip(FEATURES, map(float, trace["features"][i])))
        rows.append(row)
    return rows


def cut(trace, start, stop):
    """Steps [start, stop) of a trace, with its name and comments (a fraction of a trace to train or score on)."""
    out = {key: value[start:stop] for key, value in trace.items()
           if isinstance(value, np.ndarray) and len(value) == trace["speed"].size}
    out["comments"] = list(trace["comments"]) + [f"steps {start} to {stop} of the recorded trace"]
    out["name"] = trace["name"]
    return out


def list_traces(directory=TRACE_DIR):
    """Paths of the trace files in a directory, sorted."""
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith((".csv", ".csv.gz")))


def aggregate(trace, steps):
    """The trace as if every `steps` consecutive steps were one longer step (the same contention, less noise).

    Speed is work over time, sum(speed_i * t_i) / sum(t_i), so a slow step
    weighs as much as it lasted; telemetry and injected state are averaged
    (state: the last step's). A trace without step times weighs steps equally.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} is not allowed: it must be an integer >= 1")
    if steps == 1:
        return trace
    n = trace["speed"].size // steps * steps
    t = trace.get("step_time")
    t = np.ones(n) if t is None else np.where(np.isfinite(t[:n]) & (t[:n] > 0), t[:n], np.nan)
    speed = trace["speed"][:n]
    work = np.nansum((speed * t).reshape(-1, steps), axis=1)
    time = np.nansum(np.where(np.isfinite(speed), t, np.nan).reshape(-1, steps), axis=1)
    out = {key: value[:n][steps - 1::steps] for key, value in trace.items()
           if isinstance(value, np.ndarray) and value.ndim == 1 and value.size == trace["speed"].size}
    with np.errstate(invalid="ignore", divide="ignore"):
        out["speed"] = np.where(time > 0, work / time, np.nan)
    out["step_time"] = time
    out["features"] = trace["features"][:n].reshape(-1, steps, trace["features"].shape[1]).mean(axis=1)
    out["comments"] = list(trace["comments"]) + [f"aggregated: {steps} recorded steps per step"]
    out["name"] = f"{trace['name']}@{steps}"
    return out
