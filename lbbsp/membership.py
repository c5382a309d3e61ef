"""Carry per-worker state across a change of the set of workers (elastic training; numpy only).

Workers are known by a stable identity (e.g. "host:local_rank"), not by rank:
ranks are handed out anew after every membership change. Per-worker state is
re-indexed from the old workers to the new ones; a newcomer gets a prior, the
mean of the workers that stay (booleans False, integers 0), so the split for
the new set can be computed at once and the newcomer's own measurements
correct it within a few steps.
"""
import warnings

import numpy as np

__all__ = ["worker_index", "remap_workers"]


def worker_index(old, new):
    """For each worker in `new`, its position in `old`, or -1 for a newcomer (identities must be unique)."""
    old, new = list(old), list(new)
    for name, ids in (("old", old), ("new", new)):
        if len(set(ids)) != len(ids):
            raise ValueError(f"{name} worker identities {ids!r} are not allowed: they must be unique")
    where = {worker: i for i, worker in enumerate(old)}
    return np.array([where.get(worker, -1) for worker in new], dtype=np.int64)


def _remap_array(values, index, empty=None):
    values = np.asarray(values)
    known = index[index >= 0]
    out = values[..., np.maximum(index, 0)].copy()
    newcomers = index < 0
    if not newcomers.any():
        return out
    if empty is not None:
        prior = empty
    elif values.dtype == bool:
        prior = False
    elif np.issubdtype(values.dtype, np.integer):
        prior = 0
    else:
        stays = values[..., known].astype(np.float64)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row has a NaN prior, as intended
            prior = np.nanmean(stays, axis=-1, keepdims=True) if known.size else np.nan
    out[..., newcomers] = prior
    return out


def remap_workers(state, index, old_size, empty=None, _key=None):
    """`state` with every per-worker array re-indexed by `index` (see `worker_index`).

    Convention (kept by every policy and the step-time model): an array
    whose last axis has `old_size` entries is per worker along that axis;
    dicts, lists and tuples are walked; anything else is kept as it is.
    `empty` maps the keys of observations (not estimates) to the value a
    newcomer starts with instead of the mean, e.g. {"_sums": 0.0}: its own
    first measurements then count in full.
    """
    index = np.asarray(index, dtype=np.int64)
    empty = empty or {}
    if isinstance(state, dict):
        return {key: remap_workers(value, index, old_size, empty, key) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(remap_workers(value, index, old_size, empty, _key) for value in state)
    if isinstance(state, np.ndarray) and state.ndim >= 1 and state.shape[-1] == old_size:
        return _remap_array(state, index, empty.get(_key))
    return state
