"""Carry per-worker state across a change of the set of workers (elastic training; numpy only).

Workers are known by a stable identity (e.g. "host:local_rank"), not by rank:
ranks are handed out anew after every membership change. Every stateful part
declares its per-worker fields by name with what a newcomer starts from (e.g.
`StepTimeModel.PER_WORKER`): "mean", the mean of the workers that stay (an
estimate the newcomer's own measurements soon correct), or a value (an
observation it has not made yet, such as no sums, no floor, no batch shapes).
"""
import warnings

import numpy as np

__all__ = ["worker_index", "remap"]


def worker_index(old, new):
    """For each worker in `new`, its position in `old`, or -1 for a newcomer (identities must be unique)."""
    old, new = list(old), list(new)
    for name, ids in (("old", old), ("new", new)):
        if len(set(ids)) != len(ids):
            raise ValueError(f"{name} worker identities {ids!r} are not allowed: they must be unique")
    where = {worker: i for i, worker in enumerate(old)}
    return np.array([where.get(worker, -1) for worker in new], dtype=np.int64)


def _remap_array(values, index, newcomer):
    values = np.asarray(values)
    out = values[..., np.maximum(index, 0)].copy()
    joined = index < 0
    if joined.any():
        if isinstance(newcomer, str):  # "mean"
            stays = values[..., index[index >= 0]].astype(np.float64)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row gives a NaN prior, as intended
                newcomer = np.nanmean(stays, axis=-1, keepdims=True) if stays.size else np.nan
        out[..., joined] = newcomer
    return out


def remap(state, index, per_worker):
    """`state` (a dict) with each field named in `per_worker` re-indexed by `index` (see `worker_index`): a
    numpy array along its last axis, a list item by item; a newcomer's entry is what `per_worker` names for it.
    Other fields are kept as they are."""
    index = np.asarray(index, dtype=np.int64)
    out = dict(state)
    for name, newcomer in per_worker.items():
        value = state[name]
        if isinstance(value, (list, tuple)):
            out[name] = [value[i] if i >= 0 else newcomer for i in index]
        else:
            out[name] = _remap_array(value, index, newcomer)
    return out
