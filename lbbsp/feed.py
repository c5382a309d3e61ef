"""The data side of load-balanced BSP: which samples this worker reads at each step (numpy only).

`BatchFeed` serves, at step t of an epoch, this worker's sub-slice of the
global batch under the batch sizes decided for step t (see sharding.py). It
holds the one queue of decided plans (lbbsp.controller.Plan): the balancer
publishes each step's plan as soon as it is decided (with plan_ahead = 1, a
step before it runs), the input pipeline may read up to `prefetch` published
steps ahead of the step that trains, never more, and the train thread takes
the plan of the step it runs from the same queue. The feed records what it
served, so the balancer can check that every step read exactly the batch
decided for it, once.
"""
import collections
import threading

import numpy as np

from .allocation import Bounds, default_multiple
from .checks import integer
from .sharding import EpochSchedule, epoch_permutation, local_indices

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
    from Horovod). `b_min`, `b_max` and `batch_multiple` bound the batch
    sizes the policy may choose (lbbsp.allocation; `batch_multiple` is its
    batch grid, None for lbbsp.allocation.default_multiple: 1 on CPU workers).
    """

    def __init__(self, x, y=None, *, global_batch, sample_weight=None, seed=0, shuffle=True,
                 drop_remainder=False, b_min=1, b_max=None, batch_multiple=None, prefetch=0, rank=0, size=1,
                 _source=None):
        self.source = _source if _source is not None else ArraySource(x, y, sample_weight)
        n = self.source.num_samples
        self.num_samples = integer("num_samples", n, 1, what=" (the data must hold at least one sample)")
        self.seed = integer("seed", seed)
        Bounds.of(1, global_batch, b_min)
        self.batch_multiple = integer("batch_multiple", batch_multiple, 1, optional=True,
                                      what=" (None: automatic; 1: any batch size; 8: every batch a multiple of 8)")
        self.prefetch = integer("prefetch", prefetch, 0, what=" (steps read ahead)")
        self.global_batch = int(global_batch)
        self.shuffle, self.drop_remainder = bool(shuffle), bool(drop_remainder)
        self.b_min, self.b_max = int(b_min), b_max
        self.gpu = False
        self._cond = threading.Condition()
        self.generation = 0
        self.bind(rank, size)

    @classmethod
    def from_function(cls, fn, num_samples, *, global_batch, **kwargs):
        """A feed whose samples come from `fn(indices)`, which returns a batch like `(x, y)` for an index array."""
        return cls(None, global_batch=global_batch, _source=FunctionSource(fn, num_samples), **kwargs)

    def bind(self, rank, size, resume=None, global_batch=None):
        """Fix this worker's rank and the number of workers; recompute the epoch schedule.

        `resume=(epoch, position)`: that epoch continues from sample `position`
        of its permutation (the samples before it were trained on before a
        membership change). `global_batch` changes the global batch from now on.
        """
        size = integer("size", size, 1)
        integer("rank", rank, 0, size - 1, what=f" (size={size})")
        if global_batch is not None:
            Bounds.of(1, global_batch, self.b_min)
        global_batch = self.global_batch if global_batch is None else int(global_batch)
        schedule = EpochSchedule(self.num_samples, global_batch, size, self.b_min, self.drop_remainder, resume)
        largest = int(schedule.full.max())
        upper = Bounds.of(size, global_batch, self.b_min, self.b_max).upper
        if self.b_max is not None and largest > int(upper.sum()):
            raise ValueError(
                f"b_max={self.b_max!r} is not allowed: the last step of an epoch holds {largest} samples "
                f"and the {size} workers can take at most {int(upper.sum())}; raise b_max or pass drop_remainder=True"
            )
        self.epoch_schedule, self.schedule, self.global_batch = schedule, schedule.full, global_batch
        self.rank, self.size = int(rank), int(size)
        self.reopen()

    def use_device(self, gpu):
        """Whether some worker trains on a GPU, on which the default batch grid depends (set as training begins)."""
        self.gpu = bool(gpu)

    @property
    def grid(self):
        """The batch grid in use: `batch_multiple`, or the default for this global batch, number of workers and
        device."""
        return self.batch_multiple or default_multiple(self.global_batch, self.size, self.gpu)

    @property
    def bounds(self):
        """The batch sizes each worker may run (`b_min`, `b_max`) and the batch grid, as lbbsp.allocation.Bounds."""
        return Bounds.of(self.size, self.global_batch, self.b_min, self.b_max, self.grid)

    @property
    def steps_per_epoch(self):
        """Steps of a whole epoch (the resumed epoch has `epoch_schedule.steps_in(epoch)`)."""
        return self.epoch_schedule.steps_per_epoch

    def reopen(self):
        """Forget all plans (start of training); readers of an earlier dataset stop."""
        with self._cond:
            self.generation += 1
            self._published = collections.OrderedDict()  # (epoch, step) -> Plan, until training passes the step
            self._unread = collections.deque()
            self._served = collections.OrderedDict()
            self._perms = {}
            self._training = None
            self._closed = False
            self._cond.notify_all()

    def close(self):
        """End of training: a reader waiting for a plan stops instead of waiting forever."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _index(self, key):
        return self.epoch_schedule.index(*key)

    def _checked(self, plan):
        sizes = np.asarray(plan.sizes, dtype=np.int64)
        total = int(self.epoch_schedule.of(plan.epoch)[plan.step])
        if sizes.shape != (self.size,) or int(sizes.sum()) != total:
            raise ValueError(f"batches={sizes.tolist()} is not allowed at step {plan.step}: it needs {self.size} "
                             f"sizes summing to {total}")
        return plan

    def publish(self, plan):
        """Queue a step's `lbbsp.controller.Plan` (steps are published in order; a step published twice keeps
        its first plan)."""
        self._checked(plan)
        with self._cond:
            if plan.key not in self._published and plan.key not in self._served:
                self._published[plan.key] = plan
                self._unread.append(plan.key)
                self._cond.notify_all()

    def replace(self, plan):
        """Replace the plan of a step not read yet (the ranks had planned it differently); False once it was read."""
        self._checked(plan)
        with self._cond:
            if plan.key in self._served:
                return False
            if plan.key in self._published:
                self._published[plan.key] = plan
                return True
        self.publish(plan)
        return True

    def plan_of(self, epoch, step):
        """The published Plan of (epoch, step), or None."""
        with self._cond:
            return self._published.get((int(epoch), int(step)))

    def start_step(self, epoch, step):
        """The step that trains now: the reader may be at most `prefetch` steps ahead of it."""
        key = (int(epoch), int(step))
        with self._cond:
            self._training, now = key, self._index(key)
            while self._published and self._index(next(iter(self._published))) < now:  # published in order
                self._published.popitem(last=False)
            self._cond.notify_all()

    def served(self, epoch, step):
        """(samples, times, ahead): what this worker read for (epoch, step) ((None, 0) if it was not read), and how
        many steps after it the furthest step read is."""
        key = (int(epoch), int(step))
        with self._cond:
            samples, times = self._served.get(key, (None, 0))
            ahead = self._index(next(reversed(self._served))) - self._index(key) if self._served else 0
        return samples, times, ahead

    def indices(self, epoch, step, batches, rank=None):
        """Sample indices that `rank` (default: this worker) reads at (epoch, step) under `batches`."""
        perm = epoch_permutation(self.num_samples, self.seed, epoch, self.shuffle)
        start = self.epoch_schedule.offsets(epoch)[step]
        return local_indices(perm, start, batches, self.rank if rank is None else rank)

    def next_indices(self, timeout=600.0, generation=None):
        """(epoch, step, indices) of the next planned step, in order; None once the feed is closed.

        Waits for the plan when the reader is within `prefetch` steps of the
        training step; raises RuntimeError when it reads further ahead (the
        dataset was wrapped in something that reads ahead) or no plan comes
        within `timeout` seconds. A reader of `generation` (the feed's
        `generation` when its dataset was made) also stops once the feed was
        reopened, so an iterator left over from an interrupted fit never takes
        the next fit's steps.
        """
        with self._cond:
            while True:
                if self._closed or (generation is not None and generation != self.generation):
                    return None
                if self._unread:
                    key = self._unread[0]
                    if self._training is not None and self._index(key) - self._index(self._training) > self.prefetch:
                        raise RuntimeError(
                            f"lbbsp: the input pipeline read step {key[1]} of epoch {key[0]} while step "
                            f"{self._training[1]} trains, more than prefetch={self.prefetch} steps ahead: the "
                            "dataset was wrapped (.shuffle, .batch, .prefetch, ...) after feed.dataset(); pass it "
                            "to fit unchanged and set BalancedFeed(..., prefetch=k) for read-ahead"
                        )
                    batches = self._published[self._unread.popleft()].sizes
                    break
                if not self._cond.wait(timeout):
                    raise RuntimeError(
                        f"lbbsp: no batch was planned for {timeout:.0f} s: pass lbbsp.keras.LoadBalancer(feed) in the "
                        "callbacks of fit(), and feed.dataset() to fit unchanged"
                    )
            if key[0] not in self._perms:
                self._perms = {e: p for e, p in self._perms.items() if e >= key[0] - 1}
                self._perms[key[0]] = epoch_permutation(self.num_samples, self.seed, key[0], self.shuffle)
            idx = local_indices(self._perms[key[0]], self.epoch_schedule.offsets(key[0])[key[1]], batches, self.rank)
            size, times = self._served.get(key, (len(idx), 0))
            self._served[key] = (len(idx), times + 1)
            while len(self._served) > 64:
                self._served.popitem(last=False)
        return key[0], key[1], idx

    def next_batch(self, generation=None):
        """This worker's batch for the next planned step (None once the feed is closed or reopened)."""
        item = self.next_indices(generation=generation)
        return None if item is None else self.source.take(item[2])

    def example(self):
        """One sample's batch (first index), used to infer the element structure and dtypes."""
        return self.source.take(np.array([0], dtype=np.int64))
