"""Exactly-once sharding of an epoch under per-step batch sizes (numpy only).

All ranks draw the same global permutation per epoch (seeded by seed and
epoch). Step t covers the global slice [offset_t, offset_t + B_t) of it, and
worker i takes the part that starts at offset_t + sum(b_j for j < i) and is
b_i long. Every rank runs the same number of steps, and in an epoch the union
of what the workers read is the data set, each sample once.

After a membership change (elastic training) one epoch resumes part-way: the
samples before the last committed position were trained on by the old
workers, and the rest of the permutation is scheduled anew for the new ones
(`EpochSchedule`).
"""
import logging

import numpy as np

from .checks import integer

__all__ = ["global_batch_schedule", "epoch_permutation", "local_indices", "EpochSchedule"]

log = logging.getLogger(__name__)


def global_batch_schedule(num_samples, global_batch, num_workers, b_min=1, drop_remainder=False):
    """Global batch size of each step of an epoch.

    All steps have `global_batch` samples except the last, which takes the
    remainder. A remainder too small to give every worker `b_min` samples
    borrows from the step before it (both stay >= num_workers * b_min), or is
    merged into it if the two together are too few to split; so no sample is
    dropped or read twice. With drop_remainder the partial step is skipped.
    """
    for name, value in (("num_samples", num_samples), ("global_batch", global_batch), ("num_workers", num_workers),
                        ("b_min", b_min)):
        integer(name, value, 1)
    floor = num_workers * b_min
    if global_batch < floor:
        raise ValueError(
            f"global_batch={global_batch} is not allowed: with {num_workers} workers and b_min={b_min} "
            f"it must be at least {floor}"
        )
    full, rest = divmod(int(num_samples), int(global_batch))
    if drop_remainder or rest == 0:
        if full == 0:
            raise ValueError(
                f"num_samples={num_samples} is not allowed with drop_remainder=True: "
                f"it must be at least global_batch={global_batch}"
            )
        return np.full(full, global_batch, dtype=np.int64)
    if rest >= floor:
        return np.array([global_batch] * full + [rest], dtype=np.int64)
    if full == 0:
        raise ValueError(
            f"num_samples={num_samples} is not allowed: {num_workers} workers with b_min={b_min} "
            f"need at least {floor} samples"
        )
    tail = global_batch + rest
    if tail >= 2 * floor:
        return np.array([global_batch] * (full - 1) + [tail - floor, floor], dtype=np.int64)
    return np.array([global_batch] * (full - 1) + [tail], dtype=np.int64)


def epoch_permutation(num_samples, seed, epoch, shuffle=True):
    """The global order of samples in `epoch`: identical on every rank for the same (seed, epoch)."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)])
    return rng.permutation(num_samples).astype(np.int64)


def local_indices(permutation, step_offset, batches, rank):
    """Indices that worker `rank` reads at a step that starts at `step_offset` in the permutation."""
    batches = np.asarray(batches, dtype=np.int64)
    start = int(step_offset) + int(batches[:rank].sum())
    return permutation[start:start + int(batches[rank])]


def _starts(steps):
    """Where each step starts, for steps of these global batches from position 0."""
    return (np.cumsum(steps) - steps).astype(np.int64)


class EpochSchedule:
    """Global batch of every step of every epoch, where epoch `resume[0]` may start at sample `resume[1]`.

    Steps are numbered from 0 in every epoch, the resumed one included (its
    step 0 starts at the resume position). `index` numbers all steps of the
    run consecutively, so step distances are right across the short epoch.
    When the samples left after the resume position cannot be split over the
    workers with `b_min` each (fewer than num_workers x b_min, or fewer than
    a global batch with drop_remainder), that epoch has no steps left and
    they are skipped, with a warning: the one documented exception to
    exactly-once.
    """

    def __init__(self, num_samples, global_batch, num_workers, b_min=1, drop_remainder=False, resume=None):
        self._set_full(global_batch_schedule(num_samples, global_batch, num_workers, b_min, drop_remainder))
        self.num_samples = int(num_samples)
        if resume is None:
            return
        epoch, position = resume
        self.resume_epoch = integer("resume epoch", epoch, 0)
        self.position = integer("resume position", position, 0, self.num_samples)
        rest = self.num_samples - self.position
        if rest:
            try:
                self._part = global_batch_schedule(rest, global_batch, num_workers, b_min, drop_remainder)
            except ValueError as exc:
                log.warning("the last %d samples of epoch %d are skipped in that epoch: %s", rest, epoch, exc)
        self._part_offsets = self.position + _starts(self._part)

    @classmethod
    def from_steps(cls, steps):
        """Every epoch has these global batches per step (simulations and tests)."""
        schedule = cls.__new__(cls)
        schedule._set_full(np.asarray(steps, dtype=np.int64).reshape(-1))
        return schedule

    def _set_full(self, full):
        self.full = full
        self.num_samples = int(full.sum())
        self._full_offsets = _starts(full)
        self.resume_epoch, self.position = None, 0
        self._part = self._part_offsets = full[:0]

    @property
    def steps_per_epoch(self):
        """Steps of a whole epoch."""
        return int(self.full.size)

    def of(self, epoch):
        """Global batch of each step of `epoch`."""
        return self._part if epoch == self.resume_epoch else self.full

    def offsets(self, epoch):
        """Where each step of `epoch` starts in that epoch's permutation."""
        return self._part_offsets if epoch == self.resume_epoch else self._full_offsets

    def steps_in(self, epoch):
        return int(self.of(epoch).size)

    def index(self, epoch, step):
        """Consecutive number of (epoch, step) in the run."""
        n = int(epoch) * self.steps_per_epoch + int(step)
        if self.resume_epoch is not None and epoch > self.resume_epoch:
            n -= self.steps_per_epoch - self._part.size
        return n

    def after(self, epoch, step, ahead):
        """(epoch, step) `ahead` steps after (epoch, step), skipping epochs without steps."""
        epoch, step = int(epoch), int(step) + int(ahead)
        while step >= self.steps_in(epoch):
            step -= self.steps_in(epoch)
            epoch += 1
        return epoch, step

    def end_position(self, epoch, step):
        """Samples of `epoch` consumed once (epoch, step) is done (the resume position after it)."""
        return int(self.offsets(epoch)[step] + self.of(epoch)[step])
