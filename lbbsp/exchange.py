"""What the ranks exchange at every step: one row of floats per worker, packed and read by name (numpy only).

The row rides in the gradients' sum-allreduce (rank i writes row i of an
N x len(FIELDS) matrix of zeros, so the sum holds every rank's row). Fields:

- ``forecast``: this worker's forecast of its batch-free speed for the next
  step (samples/s at zero fixed cost, see lbbsp.steptime), NaN when its
  policy forecasts nothing;
- ``compute``: seconds this worker was busy in this step before it could join
  the allreduce (lbbsp.keras.optimizer);
- ``split``: a digest of the split this worker ran in this step
  (lbbsp.consistency.digest): every rank must run the same split;
- ``decision``: CPU seconds this rank's latest decision took (0 before
  any), from which every rank sets the same decision period
  (lbbsp.controller).

Everything else a decision needs (the batch sizes) is already known to every
rank, so nothing else travels.
"""
import collections

import numpy as np

__all__ = ["FIELDS", "Gathered", "empty", "pack_local", "unpack"]

#: Every column, in order.
FIELDS = ("forecast", "compute", "split", "decision")
#: The gathered columns by name, each an array with one entry per worker.
Gathered = collections.namedtuple("Gathered", FIELDS)


def empty(num_workers, dtype=np.float64, fill=np.nan):
    """An (N, len(FIELDS)) matrix filled with `fill`."""
    return np.full((int(num_workers), len(FIELDS)), fill, dtype=dtype)


def pack_local(out, rank, **values):
    """Zero `out` and write `values` (names in FIELDS) into row `rank`; returns `out`."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValueError(f"fields {sorted(unknown)} are not allowed: the exchanged row has {FIELDS}")
    out[:] = 0.0
    for name, value in values.items():
        out[rank, FIELDS.index(name)] = value
    return out


def unpack(matrix):
    """The gathered (N, len(FIELDS)) matrix as named columns (float64)."""
    return Gathered(*np.asarray(matrix, dtype=np.float64).T[:len(FIELDS)])
