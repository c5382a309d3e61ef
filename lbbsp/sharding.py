"""Exactly-once sharding of an epoch under per-step batch sizes (numpy only).

All ranks draw the same global permutation per epoch (seeded by seed and
epoch). Step t covers the global slice [offset_t, offset_t + B_t) of it, and
worker i takes the part that starts at offset_t + sum(b_j for j < i) and is
b_i long. Every rank runs the same number of steps, and in an epoch the union
of what the workers read is the data set, each sample once.
"""
import numpy as np

__all__ = ["global_batch_schedule", "epoch_permutation", "local_indices"]


def global_batch_schedule(num_samples, global_batch, num_workers, b_min=1, drop_remainder=False):
    """Global batch size of each step of an epoch.

    All steps have `global_batch` samples except the last, which takes the
    remainder. A remainder too small to give every worker `b_min` samples
    borrows from the step before it (both stay >= num_workers * b_min), or is
    merged into it if the two together are too few to split; so no sample is
    dropped or read twice. With drop_remainder the partial step is skipped.
    """
    for name, value, low in (("num_samples", num_samples, 1), ("global_batch", global_batch, 1),
                             ("num_workers", num_workers, 1), ("b_min", b_min, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name}={value!r} is not allowed: it must be an integer >= {low}")
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
