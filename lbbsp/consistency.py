"""Checks that every rank runs the same split (numpy only).

Every rank computes the decision itself from the same gathered numbers, so
the ranks agree only as long as their arithmetic agrees bit for bit. On one
machine type it does. Across CPU generations it need not: numpy picks its
exp and log kernels by instruction set (AVX-512 or AVX2), and the two round
differently in the last bit for about a quarter of all inputs. A last bit is
enough to move one sample between two workers at some step, and from there
the policies' states part ways. Ranks that run different splits read
overlapping samples and weight their gradients by sizes that do not add up
to the global batch.

Two guards, both deterministic on every rank:

- at the start of training the ranks compare how their numpy was built and
  dispatched (`numpy_build`, `build_mismatch`): a difference is logged with
  the setting that removes it;
- at every step each worker sends a digest of the split it ran (`digest`,
  the exchanged field ``split``); when the digests differ, every rank sees
  it in the same gathered matrix, and the callback adopts rank 0's
  decision state (lbbsp.keras.callbacks).
"""
import functools
import importlib

import numpy as np

__all__ = ["digest", "digests_agree", "numpy_build", "build_mismatch"]

#: The digest is taken modulo this prime below 2**24, so it is exact in the exchanged float32 row.
_PRIME = 16777213


def digest(sizes):
    """A number in [0, 2**24) that differs, but for one chance in ~2**24, between two different splits.

    Integer arithmetic only (a weighted sum modulo a prime, each worker with
    its own weight), so it is the same on every CPU.
    """
    b = np.asarray(sizes, dtype=np.int64).reshape(-1) % _PRIME
    return float(np.sum((b * _weights(b.size)) % _PRIME) % _PRIME)


@functools.lru_cache(maxsize=8)
def _weights(num_workers):
    """Each worker's weight in the digest (read-only, kept per number of workers)."""
    weights = (np.arange(1, num_workers + 1, dtype=np.int64) * 2654435761) % _PRIME
    weights.setflags(write=False)
    return weights


def digests_agree(digests):
    """True when every worker's digest is the same (a worker that sent NaN, none, is not compared)."""
    d = np.asarray(digests, dtype=np.float64)
    d = d[np.isfinite(d)]
    return bool(d.size == 0 or np.all(d == d[0]))


def numpy_build():
    """numpy's version and the CPU features its kernels are dispatched to on this machine."""
    for where in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # numpy 2, numpy 1
        try:
            umath = importlib.import_module(where)
            dispatch, features = umath.__cpu_dispatch__, umath.__cpu_features__
        except (ImportError, AttributeError):
            continue
        return {"numpy": np.__version__, "dispatch": sorted(f for f in dispatch if features.get(f))}
    return {"numpy": np.__version__, "dispatch": []}  # a numpy that does not report its dispatch: its version


def build_mismatch(builds):
    """None when every rank's `numpy_build` is the same; otherwise what differs and how to align it."""
    first = builds[0]
    if all(b == first for b in builds):
        return None
    versions = sorted({b["numpy"] for b in builds})
    if len(versions) > 1:
        return (f"the workers run numpy {versions}: install the same numpy everywhere, or the ranks may compute "
                "different splits")
    features = [set(b["dispatch"]) for b in builds]
    uncommon = sorted(set.union(*features) - set.intersection(*features))
    ranks = [r for r, f in enumerate(features) if f != features[0]]
    return (f"numpy on ranks {ranks} dispatches to other CPU features than on rank 0 ({uncommon} are not on every "
            f"worker), so its exp and log may round differently and the ranks compute different splits; set "
            f"NPY_DISABLE_CPU_FEATURES=\"{' '.join(uncommon)}\" on every worker (horovodrun -x ...) to run the same "
            "kernels everywhere")
