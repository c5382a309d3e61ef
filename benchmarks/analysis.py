"""Figures of one benchmark run from the per-rank step histories and per-epoch timings (numpy only).

- epoch_time: mean training time of the epochs after the first (tracing and warm-up);
- throughput: samples per second over those epochs;
- efficiency (eta): sum over steps of T* = B / sum_i(b_i / t_i) over sum of max_i t_i,
  with t_i each worker's busy time (1.0 when every worker finishes together);
- idle_fraction: time blocked in the allreduce over wall time, all ranks together;
- straggler: mean over steps of (max t_i - min t_i) / mean t_i;
- time_to_accuracy: training time until the test accuracy first reaches the target.
"""
import math

import numpy as np

from lbbsp.metrics import summarize_steps

__all__ = ["summarize", "step_matrix"]


def step_matrix(histories, field, skip_epochs=1):
    """(steps, N) array of `field` for the steps every rank recorded, epochs before `skip_epochs` dropped."""
    keyed = [{(r["epoch"], r["step"]): r[field] for r in rows if r["epoch"] >= skip_epochs} for rows in histories]
    if not keyed or not all(keyed):
        return np.zeros((0, len(histories)))
    common = sorted(set.intersection(*(set(k) for k in keyed)))
    return np.array([[k[key] for k in keyed] for key in common], dtype=np.float64)


def summarize(histories, epochs, global_batch, num_samples, target_accuracy):
    """Figures of a run: `histories` per rank (rows of lbbsp's step history), `epochs` per-epoch dicts."""
    times = [e["time"] for e in epochs]
    steady = times[1:] if len(times) > 1 else times
    epoch_time = float(np.mean(steady))
    out = {
        "epoch_times": times,
        "epoch_time": epoch_time,
        "throughput": num_samples / epoch_time if epoch_time > 0 else float("nan"),
        "accuracy": [e["accuracy"] for e in epochs],
        "final_accuracy": epochs[-1]["accuracy"] if epochs else None,
        "time_to_accuracy": None,
    }
    elapsed = 0.0
    for e in epochs:
        elapsed += e["time"]
        if e["accuracy"] is not None and e["accuracy"] >= target_accuracy:
            out["time_to_accuracy"] = elapsed
            break
    batches = step_matrix(histories, "batch")
    compute = step_matrix(histories, "compute")
    if batches.size:
        balance = summarize_steps(batches, compute)
        wait, wall = step_matrix(histories, "wait"), step_matrix(histories, "step_time")
        out.update(
            efficiency=balance["efficiency"],
            straggler=balance["straggler"],
            idle_fraction=float(wait.sum() / wall.sum()) if wall.sum() > 0 else float("nan"),
            step_time=float(np.mean(np.max(wall, axis=1))),
            mean_batch=[float(v) for v in batches.mean(axis=0)],
            overhead_ms=1e3 * float(np.median(step_matrix(histories, "overhead"))),
        )
    else:
        out.update(efficiency=float("nan"), straggler=float("nan"), idle_fraction=float("nan"),
                   step_time=float("nan"), mean_batch=None, overhead_ms=float("nan"))
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}
