"""The framework-free balancer: plans handed to the train thread as immutable snapshots, decisions on their own
thread that no timing can change, state files that never stop training."""
import pickle
import threading
import time

import numpy as np
import pytest

from lbbsp.balancer import Background, Balancer
from lbbsp.controller import BalanceController
from lbbsp.feed import BatchFeed
from lbbsp.forecasting import Forecaster


def run(delay=0.0, steps=40, workers=2):
    """Every rank's balancer in one process, fed scripted compute times (worker 1 slows down 3x at step 12); with
    `delay`, rank 1's decision thread sleeps that long in every decision. Returns each rank's splits and
    forecasts."""
    x = np.arange(4096, dtype=np.float32)
    balancers = []
    for rank in range(workers):
        feed = BatchFeed(x, global_batch=256, rank=rank, size=workers)
        controller = BalanceController("lbbsp", warmup_steps=2, plan_ahead=1)
        if delay and rank == 1:
            decide = controller.decide
            controller.decide = lambda *args: (time.sleep(delay), decide(*args))[1]
        balancer = Balancer(feed, controller, Forecaster("narx", budget=None))
        balancer.begin(rank, workers)
        balancers.append(balancer)
    splits, forecasts = [[] for _ in balancers], [[] for _ in balancers]
    for t in range(steps):
        epoch, step = divmod(t, balancers[0].feed.steps_per_epoch)
        plans = [b.before_step(epoch, step) for b in balancers]
        speeds = np.array([1000.0, 1000.0 if t < 12 else 333.0])
        rows = np.zeros((workers, 4))
        for rank, (balancer, plan) in enumerate(zip(balancers, plans)):
            compute = (20.0 + plan.sizes[rank]) / speeds[rank]
            local = balancer.local(compute)
            rows[rank] = (local["forecast"], compute, local["split"], local["decision"])
            splits[rank].append(np.asarray(plan.sizes).tolist())
            forecasts[rank].append(local["forecast"])
        for balancer in balancers:
            balancer.after_step(epoch, step, rows, dict(overhead=0.0, overhead_cpu=0.0), broadcast=lambda obj: obj)
    for balancer in balancers:
        balancer.end()
    return splits, forecasts


def test_a_slow_decision_thread_changes_no_decision():
    splits, forecasts = run()
    slow_splits, slow_forecasts = run(delay=0.02)
    assert splits[0] == splits[1] == slow_splits[0] == slow_splits[1]
    assert np.array_equal(np.array(forecasts), np.array(slow_forecasts), equal_nan=True)
    assert splits[0][-1][0] > 2 * splits[0][-1][1], "the slowed worker's batch moved"


def test_queued_decisions_run_in_order_once_released():
    background, ran = Background(), []
    first, second = background.submit(ran.append, 1), background.submit(ran.append, 2)
    time.sleep(0.05)
    assert ran == [], "a queued decision started before it was released"
    background.release()
    first.result(timeout=5), second.result(timeout=5)
    third = background.submit(ran.append, 3)
    time.sleep(0.05)
    assert ran == [1, 2]
    background.release()
    third.result(timeout=5)
    assert ran == [1, 2, 3]
    background.submit(ran.append, 4, hold=False).result(timeout=0.5)  # far below WAIT: it was not held
    background.WAIT = 0.01  # never released: it runs all the same
    background.submit(ran.append, 5).result(timeout=5)
    background.WAIT = 0.0  # nothing is held (benchmarks.overhead's atonce), and the idle thread does not spin
    background.submit(ran.append, 6).result(timeout=0.5)
    idle = time.process_time()
    time.sleep(0.3)
    assert time.process_time() - idle < 0.1, "the idle decision thread kept a core busy"
    assert ran == [1, 2, 3, 4, 5, 6]
    background.close()


def _watched(policy):
    """A one-worker feed and a controller of `policy` that notes the (epoch, step) of every decision it makes."""
    feed = BatchFeed(np.arange(4096, dtype=np.float32), global_batch=64, rank=0, size=1)
    controller = BalanceController(policy, warmup_steps=0, plan_ahead=1)
    decided, decide = [], controller.decide
    controller.decide = lambda *args: (decided.append(args[:2]), decide(*args))[1]
    return feed, controller, decided


def test_a_decision_runs_once_the_next_steps_gradients_exist():
    feed, controller, decided = _watched("lbbsp")
    balancer = Balancer(feed, controller, Forecaster("last", budget=None))
    balancer.begin(0, 1)
    for step in range(3):
        plan = balancer.before_step(0, step)
        balancer.local(0.01)
        waited = time.monotonic()
        while len(decided) < step and time.monotonic() - waited < 5:
            time.sleep(0.001)
        assert decided == [(0, s) for s in range(step)], "the decisions queued before this step's gradients ran"
        balancer.after_step(0, step, np.array([[np.nan, 0.01, plan.digest, 0.0]]),
                            dict(overhead=0.0, overhead_cpu=0.0), broadcast=lambda obj: obj)
        time.sleep(0.05)
        assert decided == [(0, s) for s in range(step)], "a decision ran beside the next step's dispatch"
    balancer.end()
    assert decided == [(0, 0), (0, 1), (0, 2)]


def test_under_a_cpu_quota_a_decision_runs_at_once(tmp_path):
    feed, controller, decided = _watched("equal")
    balancer = Balancer(feed, controller)  # no telemetry: the quota is read all the same
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # cgroup v2: half a core
    balancer.quota.cgroup = str(tmp_path)
    balancer.begin(0, 1)
    plan = balancer.before_step(0, 0)
    balancer.local(0.01)
    balancer.after_step(0, 0, np.array([[np.nan, 0.01, plan.digest, 0.0]]), dict(overhead=0.0, overhead_cpu=0.0),
                        broadcast=lambda obj: obj)
    waited = time.monotonic()
    while not decided and time.monotonic() - waited < 0.5:  # far below Background.WAIT
        time.sleep(0.001)
    assert decided == [(0, 0)], "a decision under a quota waited for the next step"
    balancer.end()


def test_the_train_thread_reads_only_the_plans_it_is_handed():
    feed = BatchFeed(np.arange(512, dtype=np.float32), global_batch=64, rank=0, size=1)
    balancer = Balancer(feed, BalanceController("lbbsp", warmup_steps=0), Forecaster("last", budget=None))
    balancer.begin(0, 1)
    plan = balancer.before_step(0, 0)
    with pytest.raises(ValueError):
        plan.offsets[0] = 1.0  # a snapshot: the decision thread cannot change what this step runs with
    assert threading.current_thread() is threading.main_thread()
    balancer.local(0.01)
    balancer.after_step(0, 0, np.array([[np.nan, 0.01, plan.digest, 0.0]]), dict(overhead=0.0, overhead_cpu=0.0),
                        broadcast=lambda obj: obj)
    assert balancer.before_step(0, 1).key == (0, 1)
    balancer.end()


def test_a_step_whose_optimizer_did_not_report_is_a_clear_error():
    feed = BatchFeed(np.arange(512, dtype=np.float32), global_batch=64, rank=0, size=1)
    balancer = Balancer(feed, BalanceController("equal"))
    balancer.begin(0, 1)
    balancer.before_step(0, 0)
    with pytest.raises(RuntimeError, match="did not go through lbbsp.keras.DistributedOptimizer"):
        balancer.after_step(0, 0, np.zeros((1, 4)), dict(overhead=0.0, overhead_cpu=0.0), broadcast=lambda o: o)
    balancer.end()


@pytest.mark.parametrize("content", [{"version": 1, "controller": {}}, b"not a pickle",
                                     b"\x80\x04\x95\x1b\x00\x00\x00\x00\x00\x00\x00\x8c\x0elbbsp.pooling\x94\x8c"
                                     b"\x04Pool\x94\x93\x94."])
def test_a_state_file_of_another_version_starts_afresh_with_a_warning(tmp_path, caplog, content):
    import pickle
    path = tmp_path / "state.pkl"
    path.write_bytes(pickle.dumps(content) if isinstance(content, dict) else content)
    feed = BatchFeed(np.arange(512, dtype=np.float32), global_batch=64, rank=0, size=1)
    balancer = Balancer(feed, BalanceController("lbbsp", warmup_steps=0), Forecaster("last", budget=None))
    balancer.begin(0, 1)
    assert balancer.restore(str(path), broadcast=lambda obj: obj) is False
    assert "starting from equal batches" in caplog.text
    balancer.end()


def test_a_state_that_cannot_be_saved_warns_and_training_goes_on(tmp_path, caplog):
    class Unpicklable(Forecaster):
        def __reduce__(self):
            raise TypeError("cannot pickle this predictor")

    feed = BatchFeed(np.arange(512, dtype=np.float32), global_batch=64, rank=0, size=1)
    balancer = Balancer(feed, BalanceController("lbbsp", warmup_steps=0), Forecaster("last", budget=None))
    balancer.begin(0, 1)
    path = str(tmp_path / "state.pkl")
    assert balancer.save(path, 0, 0)
    saved = open(path, "rb").read()
    balancer.forecaster.predictor = Unpicklable("last")
    with caplog.at_level("WARNING", logger="lbbsp"):
        assert not balancer.save(path, 0, 1)
    assert "saving the state to" in caplog.text and "cannot pickle this predictor" in caplog.text
    assert open(path, "rb").read() == saved and sorted(p.name for p in tmp_path.iterdir()) == ["state.pkl"]
    assert not balancer.save(str(tmp_path / "gone" / "state.pkl"), 0, 2)  # a folder removed while training
    balancer.end()


def test_a_saved_state_that_does_not_load_starts_from_equal_batches(tmp_path, caplog):
    feed = BatchFeed(np.arange(512, dtype=np.float32), global_batch=64, rank=0, size=2)
    balancer = Balancer(feed, BalanceController("lbbsp", warmup_steps=0))
    balancer.begin(0, 2)
    path = tmp_path / "state.pkl"
    path.write_bytes(pickle.dumps({"version": 2, "epoch": 0, "step": 0, "predictor": None,
                                   "controller": {"policy": "lbbsp", "steps_seen": 3, "state": "garbage"}}))
    with caplog.at_level("WARNING", logger="lbbsp"):
        assert not balancer.restore(str(path), broadcast=lambda obj: obj)
    assert "state does not fit this job" in caplog.text
    assert balancer.before_step(0, 0).sizes.tolist() == [32, 32]
    balancer.end()
