"""The rank-agreement checks: split digests and the numpy-build comparison (pure, no Horovod)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbsp import exchange
from lbbsp.consistency import build_mismatch, digest, digests_agree, numpy_build


@given(st.lists(st.integers(0, 2 ** 24 - 4), min_size=1, max_size=2048), st.data())  # batches below the prime
@settings(max_examples=300, deadline=None)
def test_digest_is_exact_in_float32_and_moves_with_any_sample_moved(sizes, data):
    d = digest(sizes)
    assert 0 <= d < 2 ** 24 and float(np.float32(d)) == d == digest(np.array(sizes))
    if len(sizes) > 1:
        i, j = data.draw(st.lists(st.integers(0, len(sizes) - 1), min_size=2, max_size=2, unique=True))
        moved = list(sizes)
        moved[i], moved[j] = moved[i] + 1, moved[j] - 1
        assert digest(moved) != d  # one sample from one worker to another
        swapped = list(sizes)
        swapped[i], swapped[j] = swapped[j], swapped[i]
        assert (digest(swapped) == d) == (sizes[i] == sizes[j])


def test_digests_survive_the_exchange_and_disagree_on_one_rank():
    rows = exchange.empty(3, np.float32, 0.0)
    for rank in range(3):
        exchange.pack_local(rows, rank, split=digest([9, 1 if rank < 2 else 2, 14]))
        if rank == 0:
            total = rows.copy()
        else:
            total += rows
    split = exchange.unpack(total).split
    assert not digests_agree(split) and digests_agree(split[:2])
    assert digests_agree([np.nan, 5.0, 5.0]) and digests_agree([np.nan, np.nan])


def test_build_mismatch_names_what_differs_and_the_setting_that_aligns_it():
    here = numpy_build()
    assert here["numpy"] == np.__version__ and build_mismatch([here, dict(here)]) is None
    avx2 = {"numpy": "1.26.4", "dispatch": ["AVX2", "FMA3"]}
    avx512 = {"numpy": "1.26.4", "dispatch": ["AVX2", "AVX512F", "AVX512_SKX", "FMA3"]}
    message = build_mismatch([avx512, avx512, avx2])
    assert "ranks [2]" in message and 'NPY_DISABLE_CPU_FEATURES="AVX512F AVX512_SKX"' in message
    assert "numpy ['1.26.4', '2.0.0']" in build_mismatch([avx2, dict(avx2, numpy="2.0.0")])
