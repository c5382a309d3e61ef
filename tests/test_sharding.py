"""Exactly-once coverage of an epoch under random batch-size schedules, on 1, 2 and 3 ranks."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbsp.controller import Plan
from lbbsp.feed import BatchFeed
from lbbsp.sharding import epoch_permutation, global_batch_schedule

from helpers import plan, proportional


@given(n=st.integers(1, 400), size=st.sampled_from([1, 2, 3]), batch=st.integers(1, 64),
       seed=st.integers(0, 2**31), epoch=st.integers(0, 5), b_min=st.integers(1, 3))
@settings(max_examples=300, deadline=None)
def test_every_sample_exactly_once_per_epoch(n, size, batch, seed, epoch, b_min):
    batch = max(batch, size * b_min)
    if n < size * b_min:
        with pytest.raises(ValueError, match=f"num_samples={n}"):
            global_batch_schedule(n, batch, size, b_min)
        return
    feeds = [BatchFeed(np.arange(n), np.arange(n) * 10, global_batch=batch, seed=seed, b_min=b_min,
                          rank=rank, size=size) for rank in range(size)]
    rng = np.random.default_rng(seed)
    seen = []
    for step in range(feeds[0].steps_per_epoch):
        batches = proportional(rng.uniform(0.01, 1.0, size), int(feeds[0].schedule[step]), b_min)
        for feed in feeds:
            plan(feed, epoch, step, batches)
            x, y = feed.next_batch()
            assert len(x) == batches[feed.rank] and np.array_equal(y, x * 10)
            assert feed.served(epoch, step)[:2] == (len(x), 1)
            seen.append(x)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(n))


@pytest.mark.parametrize("n, batch, size, expected", [
    (50, 16, 2, [16, 16, 16, 2]),
    (49, 16, 2, [16, 16, 15, 2]),   # a remainder of 1 borrows from the step before
    (49, 16, 3, [16, 16, 14, 3]),
    (7, 4, 3, [4, 3]),
    (5, 4, 3, [5]),                 # too few to split in two: merged
    (64, 16, 4, [16, 16, 16, 16]),
])
def test_schedule_shapes(n, batch, size, expected):
    schedule = global_batch_schedule(n, batch, size)
    assert schedule.tolist() == expected and schedule.sum() == n


def test_drop_remainder_skips_the_partial_step():
    assert global_batch_schedule(50, 16, 2, drop_remainder=True).tolist() == [16, 16, 16]


def test_permutation_same_on_every_rank_and_new_each_epoch():
    a, b = epoch_permutation(100, 3, 0), epoch_permutation(100, 3, 0)
    assert np.array_equal(a, b) and not np.array_equal(a, epoch_permutation(100, 3, 1))
    assert np.array_equal(epoch_permutation(5, 3, 0, shuffle=False), np.arange(5))


def test_feed_grid_is_the_given_multiple_or_the_default_for_its_workers_and_device():
    feed = BatchFeed(np.zeros(512), global_batch=256, size=2)
    assert feed.grid == 1 and feed.bounds.multiple == 1, "on CPU workers any batch size"
    feed.use_device(True)
    assert feed.grid == 8 and feed.bounds.multiple == 8
    feed.bind(0, 3)
    assert feed.grid == 1  # 256 samples do not split equally on 3 workers
    feed = BatchFeed(np.zeros(512), global_batch=256, size=2, batch_multiple=4)
    feed.bind(0, 3)
    assert feed.grid == 4
    feed.use_device(True)
    assert feed.grid == 4


@pytest.mark.parametrize("kwargs, message", [
    ({"x": np.zeros((0, 3)), "global_batch": 4}, "at least one sample"),
    ({"x": np.zeros((10, 3)), "global_batch": 0}, "global_batch=0"),
    ({"x": np.zeros((10, 3)), "global_batch": -3}, "global_batch=-3"),
    ({"x": np.zeros((10, 3)), "global_batch": 4.0}, "global_batch=4.0"),
    ({"x": np.zeros((10, 3)), "y": np.zeros(9), "global_batch": 4}, "common first dimension"),
    ({"x": np.zeros((10, 3)), "global_batch": 4, "seed": "a"}, "seed='a'"),
    ({"x": np.zeros((10, 3)), "global_batch": 4, "batch_multiple": 0}, "batch_multiple=0"),
    ({"x": np.zeros((10, 3)), "global_batch": 4, "batch_multiple": 2.0}, "batch_multiple=2.0"),
])
def test_feed_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchFeed(**kwargs)


def test_feed_rejects_more_workers_than_the_batch_allows():
    with pytest.raises(ValueError, match="global_batch=4"):
        BatchFeed(np.zeros(100), global_batch=4, size=5)
    with pytest.raises(ValueError, match="rank=2"):
        BatchFeed(np.zeros(100), global_batch=4, rank=2, size=2)


def test_feed_rejects_a_tail_step_larger_than_b_max_allows():
    with pytest.raises(ValueError, match="b_max=1"):
        BatchFeed(np.zeros(3), global_batch=2, b_max=1, size=2)


def test_function_source_and_nested_arrays():
    feed = BatchFeed.from_function(lambda idx: ({"a": idx * 2}, idx), 10, global_batch=5, shuffle=False,
                                      rank=1, size=2)
    plan(feed, 0, 1, [2, 3])
    x, y = feed.next_batch()
    assert x["a"].tolist() == [14, 16, 18] and y.tolist() == [7, 8, 9]


def test_plan_rejects_wrong_batches():
    feed = BatchFeed(np.zeros(10), global_batch=5, size=2)
    with pytest.raises(ValueError, match=r"batches=\[2, 2\]"):
        plan(feed, 0, 0, [2, 2])
    with pytest.raises(RuntimeError, match="LoadBalancer"):
        BatchFeed(np.zeros(10), global_batch=5).next_indices(timeout=0.05)


def test_planned_steps_are_served_in_order_and_reading_ahead_is_bounded():
    feed = BatchFeed(np.arange(20), global_batch=4, shuffle=False, prefetch=1)
    for step in range(3):
        plan(feed, 0, step, [4])
    feed.start_step(0, 0)
    assert [feed.next_indices()[1] for _ in range(2)] == [0, 1]  # the step that trains and one ahead
    with pytest.raises(RuntimeError, match="more than prefetch=1 steps ahead"):
        feed.next_indices()
    feed.start_step(0, 1)
    assert feed.next_indices()[:2] == (0, 2)
    assert feed.served(0, 1) == (4, 1, 1) and feed.served(0, 4)[:2] == (None, 0)
    plan(feed, 0, 1, [4])  # planning a step again changes nothing
    feed.close()
    assert feed.next_indices() is None


def test_a_reader_waiting_for_a_plan_gets_it_from_another_thread():
    import threading

    feed = BatchFeed(np.arange(8), global_batch=4, shuffle=False)
    feed.start_step(0, 0)
    timer = threading.Timer(0.05, plan, args=(feed, 0, 0, [4]))
    timer.start()
    assert feed.next_indices(timeout=5)[2].tolist() == [0, 1, 2, 3]
    timer.join()


def replan(feed, epoch, step, sizes):
    return feed.replace(Plan(epoch, step, np.asarray(sizes), np.zeros(len(sizes))))


def test_replace_puts_a_step_not_read_yet_in_its_place_and_refuses_one_read():
    feed = BatchFeed(np.arange(30), global_batch=6, shuffle=False, size=2, prefetch=2)
    for step in range(3):
        plan(feed, 0, step, [3, 3])
    feed.start_step(0, 0)
    assert feed.next_indices()[2].tolist() == [0, 1, 2]
    assert not replan(feed, 0, 0, [1, 5])  # read already
    assert replan(feed, 0, 1, [2, 4]) and replan(feed, 0, 3, [5, 1])  # planned and not yet planned
    with pytest.raises(ValueError, match=r"batches=\[2, 2\]"):
        replan(feed, 0, 2, [2, 2])
    assert [feed.next_indices()[2].tolist() for _ in range(2)] == [[6, 7], [12, 13, 14]]  # steps 1, 2 in order
    feed.start_step(0, 1)
    assert feed.next_indices()[2].tolist() == [18, 19, 20, 21, 22]
