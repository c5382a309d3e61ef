"""Figures of one benchmark run from the per-rank step records and per-epoch timings (numpy only).

- epoch_time: mean training time of the epochs after the first (tracing and warm-up);
- throughput: samples per second over those epochs;
- efficiency (eta): sum over steps of T* = B / sum_i(b_i / t_i) over the sum of max_i t_i,
  with t_i each worker's compute time (1.0 when every worker finishes together);
- idle_fraction: time blocked in the allreduce over wall time, all ranks together;
- straggler: mean over steps of (max t_i - min t_i) / mean t_i;
- breakdown: per rank, mean milliseconds per step of compute (as the balancer
  sees it, lbbsp.exchange: the previous step's forecast included), allreduce
  (the blocked time of the last rank to be ready, which waits for no one),
  waiting for slower ranks (the rest of the blocked time), the plugin's own
  work in wall time and in CPU time (under a CPU quota the wall time holds
  whatever stall lands in the plugin's code; the CPU time is its cost), and
  the time the worker's cgroup was throttled (inside compute or allreduce);
- recovery: for each change of a worker's injected contention (the scenario's
  state, recorded per step by the benchmark worker), the step efficiency T*/T
  at that step and the RECOVERY_STEPS - 1 steps after it. With plan_ahead = 1
  the split that first knows of a change runs two steps after it. Each change
  is "slower" (a quota cut or a hog started), "faster" (a quota restored or a
  hog gone) or "mixed" (both at once, on different workers): recovering from
  a slowdown and from a speed-up are different problems.
"""
import math

import numpy as np

from lbbsp.metrics import balanced_time, summarize_steps

__all__ = ["summarize", "step_matrix", "breakdown", "recovery", "recovery_kinds", "RECOVERY_STEPS"]

RECOVERY_STEPS = 8


def step_matrix(histories, field, skip_epochs=1):
    """(steps, N) array of `field` for the steps every rank recorded, epochs before `skip_epochs` dropped."""
    keyed = [{(r["epoch"], r["step"]): r.get(field, math.nan) for r in rows if r["epoch"] >= skip_epochs}
             for rows in histories]
    if not keyed or not all(keyed):
        return np.zeros((0, len(histories)))
    common = sorted(set.intersection(*(set(k) for k in keyed)))
    return np.array([[k[key] for k in keyed] for key in common], dtype=np.float64)


def breakdown(histories, skip_epochs=1):
    """{part: [ms per step for each rank]} (see the module docstring), or {} without records."""
    compute = step_matrix(histories, "compute", skip_epochs)
    if not compute.size:
        return {}
    wait = step_matrix(histories, "wait", skip_epochs)
    ok = np.all(np.isfinite(wait), axis=1)
    wait = wait[ok]
    allreduce = np.repeat(wait.min(axis=1, keepdims=True), wait.shape[1], axis=1)
    parts = {
        "compute": compute,
        "allreduce": allreduce,
        "waiting": wait - allreduce,
        "plugin": step_matrix(histories, "overhead", skip_epochs),
        "plugin_cpu": step_matrix(histories, "overhead_cpu", skip_epochs),
        "throttled": step_matrix(histories, "throttled", skip_epochs),
    }
    return {name: [round(1e3 * float(v), 3) for v in np.nanmean(m, axis=0)] for name, m in parts.items()}


def _changes(histories, skip_epochs, steps):
    """(eta per step, the steps at which the contention changed with `steps` steps recorded from there on,
    each change's kind); empty without records."""
    batches = step_matrix(histories, "batch_size", skip_epochs)
    if not batches.size:
        return np.zeros(0), [], []
    compute = step_matrix(histories, "compute", skip_epochs)
    speed = step_matrix(histories, "state_speed", skip_epochs)
    hog = step_matrix(histories, "state_hog", skip_epochs)
    with np.errstate(all="ignore"):
        eta = balanced_time(batches, compute) / compute.max(axis=1)
    state = np.concatenate([speed, hog], axis=1)
    changed = np.any(state[1:] != state[:-1], axis=1) & np.all(np.isfinite(state[1:]), axis=1)
    at = [i for i in np.flatnonzero(changed) + 1 if i + steps <= eta.size]
    kinds = []
    for i in at:
        slower = bool(np.any(speed[i] < speed[i - 1]) or np.any(hog[i] > hog[i - 1]))
        faster = bool(np.any(speed[i] > speed[i - 1]) or np.any(hog[i] < hog[i - 1]))
        kinds.append("mixed" if slower == faster else "slower" if slower else "faster")
    return eta, at, kinds


def _recovered(histories, skip_epochs, steps):
    """(`recovery`, `recovery_kinds`) from one pass over the records."""
    eta, at, kinds = _changes(histories, skip_epochs, steps)
    return [[round(float(v), 4) for v in eta[i:i + steps]] for i in at], kinds


def recovery(histories, skip_epochs=1, steps=RECOVERY_STEPS):
    """Per change of contention after the skipped epochs, the step efficiency from that step on (see the
    module docstring): a list of lists of `steps` values; [] without changes or records."""
    return _recovered(histories, skip_epochs, steps)[0]


def recovery_kinds(histories, skip_epochs=1, steps=RECOVERY_STEPS):
    """The kind of each change that `recovery` follows: "slower", "faster" or "mixed" (module docstring)."""
    return _changes(histories, skip_epochs, steps)[2]


def summarize(histories, epochs, num_samples, steps_per_epoch):
    """Figures of a run: `histories` per rank (lists of step records), `epochs` per-epoch dicts."""
    times = [e["time"] for e in epochs]
    steady = times[1:] if len(times) > 1 else times
    epoch_time = float(np.mean(steady))
    out = {
        "epoch_times": times,
        "epoch_time": epoch_time,
        "step_time": epoch_time / steps_per_epoch,
        "throughput": num_samples / epoch_time if epoch_time > 0 else float("nan"),
        "losses": [e.get("loss") for e in epochs],
    }
    batches = step_matrix(histories, "batch_size")
    compute = step_matrix(histories, "compute")
    if batches.size:
        balance = summarize_steps(batches, compute)
        wait, wall = step_matrix(histories, "wait"), step_matrix(histories, "step_time")
        ok = np.all(np.isfinite(wait), axis=1)
        recovered, kinds = _recovered(histories, 1, RECOVERY_STEPS)
        out.update(
            efficiency=balance["efficiency"],
            straggler=balance["straggler"],
            idle_fraction=float(wait[ok].sum() / wall[ok].sum()) if wall[ok].sum() > 0 else float("nan"),
            compute_share=float(np.mean(compute.max(axis=1)) / np.mean(wall.max(axis=1))),
            mean_batch=[float(v) for v in batches.mean(axis=0)],
            overhead_ms=1e3 * float(np.median(step_matrix(histories, "overhead"))),
            breakdown=breakdown(histories),
            recovery=recovered,
            recovery_kinds=kinds,
        )
    else:
        out.update(efficiency=float("nan"), straggler=float("nan"), idle_fraction=float("nan"),
                   compute_share=float("nan"), mean_batch=None, overhead_ms=float("nan"), breakdown={},
                   recovery=[], recovery_kinds=[])
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}
