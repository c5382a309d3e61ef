"""What the ranks exchange at every step: one row of floats per worker, packed and read by name (numpy only).

The row rides in the gradients' sum-allreduce (rank i writes row i of an
N x len(FIELDS) matrix of zeros, so the sum holds every rank's row). Fields:

- ``forecast``: this worker's forecast of its batch-free speed for the next
  step (samples/s at zero fixed cost, see lbbsp.steptime), NaN when its
  policy forecasts nothing;
- ``wait``: seconds this worker spent blocked in the previous step's allreduce;
- ``compute``: seconds this worker was busy in this step before it could join
  the allreduce: from the end of the previous allreduce to the moment its
  gradients were ready, plus the plugin's work that followed that moment in
  the previous step (the forecast, lbbsp.keras.optimizer);
- ``split``: a digest of the split this worker ran in this step
  (lbbsp.consistency.digest): the ranks compare them, since every rank
  must run the same split.

Everything else a decision needs (the batch sizes) is already known to every
rank, so nothing else travels.
"""
import numpy as np

__all__ = ["FIELDS", "Row", "empty", "pack_local"]

#: Every column, in order.
FIELDS = ("forecast", "wait", "compute", "split")
_INDEX = {name: i for i, name in enumerate(FIELDS)}


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
        out[rank, _INDEX[name]] = value
    return out


class Row:
    """A gathered matrix read by field name: ``Row(m).compute`` is every worker's compute time."""

    __slots__ = ("matrix",)

    def __init__(self, matrix):
        self.matrix = np.asarray(matrix, dtype=np.float64)

    def __getattr__(self, name):
        if name in _INDEX:
            return self.matrix[:, _INDEX[name]]
        raise AttributeError(name)
