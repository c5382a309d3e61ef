"""The data side of load-balanced BSP: which samples this worker reads at each step (numpy only).

`BatchFeed` serves, at step t of an epoch, this worker's sub-slice of the
global batch under the batch sizes decided for step t (see sharding.py). The
callback sets the step and the batch sizes before every step; the feed
records what it served so the callback can check that the batch used at step
t is the one decided for step t.
"""
import threading

import numpy as np

from .allocation import validate_bounds
from .sharding import epoch_permutation, global_batch_schedule, local_indices

__all__ = ["BatchFeed", "ArraySource", "FunctionSource"]


def _flatten(structure):
    """Leaves of a nested tuple/list/dict of arrays, in a fixed order (dict keys sorted)."""
    if isinstance(structure, dict):
        return [leaf for key in sorted(structure) for leaf in _flatten(structure[key])]
    if isinstance(structure, (list, tuple)):
        return [leaf for item in structure for leaf in _flatten(item)]
    return [structure]


def _map(fn, structure):
    if isinstance(structure, dict):
        return {key: _map(fn, structure[key]) for key in structure}
    if isinstance(structure, (list, tuple)):
        return type(structure)(_map(fn, item) for item in structure)
    return fn(structure)


class ArraySource:
    """Samples held in memory: arrays (or nested tuples/dicts of arrays) with a common first dimension."""

    def __init__(self, x, y=None, sample_weight=None):
        parts = tuple(p for p in (x, y, sample_weight) if p is not None)
        parts = tuple(_map(np.asarray, p) for p in parts)
        lengths = {int(leaf.shape[0]) if leaf.ndim else -1 for leaf in _flatten(parts)}
        if len(lengths) != 1 or -1 in lengths:
            raise ValueError(
                f"x, y and sample_weight must be arrays with one common first dimension; got lengths {sorted(lengths)}"
            )
        self.num_samples = lengths.pop()
        self.parts = parts

    def take(self, indices):
        taken = tuple(_map(lambda a: a[indices], p) for p in self.parts)
        return taken if len(taken) > 1 else taken[0]


class FunctionSource:
    """Samples produced on demand by `fn(indices) -> batch` (for data that does not fit in memory)."""

    def __init__(self, fn, num_samples):
        if not callable(fn):
            raise ValueError(f"fn={fn!r} is not allowed: it must be a callable taking an index array")
        self.fn = fn
        self.num_samples = num_samples

    def take(self, indices):
        return self.fn(np.asarray(indices, dtype=np.int64))


class BatchFeed:
    """This worker's share of every global batch under changing per-worker batch sizes.

    Construct with arrays (`BatchFeed(x, y, global_batch=256)`) or with an
    index function (`BatchFeed.from_function(fn, num_samples, global_batch=256)`).
    `rank` and `size` fix the worker and the number of workers, on which the
    number of steps per epoch depends (lbbsp.keras.BalancedFeed takes them
    from Horovod).
    """

    def __init__(self, x, y=None, *, global_batch, sample_weight=None, seed=0, shuffle=True,
                 drop_remainder=False, b_min=1, b_max=None, rank=0, size=1, _source=None):
        self.source = _source if _source is not None else ArraySource(x, y, sample_weight)
        n = self.source.num_samples
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"num_samples={n!r} is not allowed: the data must hold at least one sample")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed={seed!r} is not allowed: it must be an integer")
        validate_bounds(1, global_batch, b_min)
        self.num_samples = int(n)
        self.global_batch = int(global_batch)
        self.seed, self.shuffle, self.drop_remainder = int(seed), bool(shuffle), bool(drop_remainder)
        self.b_min, self.b_max = int(b_min), b_max
        self._lock = threading.Lock()
        self.bind(rank, size)

    @classmethod
    def from_function(cls, fn, num_samples, *, global_batch, **kwargs):
        """A feed whose samples come from `fn(indices)`, which returns a batch like `(x, y)` for an index array."""
        return cls(None, global_batch=global_batch, _source=FunctionSource(fn, num_samples), **kwargs)

    def bind(self, rank, size):
        """Fix this worker's rank and the number of workers; recompute the epoch schedule."""
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"size={size!r} is not allowed: it must be an integer >= 1")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < size:
            raise ValueError(f"rank={rank!r} is not allowed with size={size}: it must be an integer in [0, size)")
        self.schedule = global_batch_schedule(self.num_samples, self.global_batch, size, self.b_min,
                                              self.drop_remainder)
        largest = int(self.schedule.max())
        _, _, upper = validate_bounds(size, self.global_batch, self.b_min, self.b_max)
        if self.b_max is not None and largest > int(upper.sum()):
            raise ValueError(
                f"b_max={self.b_max!r} is not allowed: the last step of an epoch holds {largest} samples "
                f"and the {size} workers can take at most {int(upper.sum())}; raise b_max or pass drop_remainder=True"
            )
        self.rank, self.size = int(rank), int(size)
        self.offsets = np.concatenate([[0], np.cumsum(self.schedule)[:-1]]).astype(np.int64)
        self._epoch = None
        self._perm = None
        self._plan = None
        self.served = None
        self.serves = 0

    @property
    def steps_per_epoch(self):
        return int(self.schedule.size)

    def plan(self, epoch, step, batches):
        """Decide what the next batch is: step `step` of `epoch` under per-worker sizes `batches`."""
        batches = np.asarray(batches, dtype=np.int64)
        if batches.shape != (self.size,) or int(batches.sum()) != int(self.schedule[step]):
            raise ValueError(
                f"batches={batches.tolist()} is not allowed at step {step}: it needs {self.size} sizes "
                f"summing to {int(self.schedule[step])}"
            )
        with self._lock:
            if epoch != self._epoch:
                self._perm = epoch_permutation(self.num_samples, self.seed, epoch, self.shuffle)
                self._epoch = epoch
            self._plan = (int(epoch), int(step), batches)
            self.serves = 0

    def indices(self, epoch, step, batches, rank=None):
        """Sample indices that `rank` (default: this worker) reads at (epoch, step) under `batches`."""
        perm = epoch_permutation(self.num_samples, self.seed, epoch, self.shuffle)
        return local_indices(perm, self.offsets[step], batches, self.rank if rank is None else rank)

    def next_batch(self):
        """This worker's batch for the planned step.

        Records (epoch, step, size) in `served` and counts the calls since the
        last plan in `serves`: more than one means something read ahead.
        """
        with self._lock:
            if self._plan is None:
                raise RuntimeError(
                    "the feed has no planned step: pass lbbsp.keras.LoadBalancer(feed) in the callbacks of fit() "
                    "and feed.dataset() to fit unchanged (no prefetch: batches are decided per step)"
                )
            epoch, step, batches = self._plan
            idx = local_indices(self._perm, self.offsets[step], batches, self.rank)
            self.served = (epoch, step, len(idx))
            self.serves += 1
        return self.source.take(idx)

    def example(self):
        """One sample's batch (first index), used to infer the element structure and dtypes."""
        return self.source.take(np.array([0], dtype=np.int64))
