"""The framework-free decision path: identical decisions on every rank, guarded forecasts, flat-memory records."""
import logging
import tracemalloc

import numpy as np
import pytest

from lbbsp import exchange
from lbbsp.controller import BalanceController
from lbbsp.forecasting import Forecaster
from lbbsp.history import StepLog
from lbbsp.policies import POLICIES, LBBSPPolicy, StepStats, make_policy
from predictor import EMAPredictor


def gathered(forecast, compute, wait=None):
    out = exchange.empty(len(forecast))
    for name, values in (("forecast", forecast), ("compute", compute), ("wait", 0.0 if wait is None else wait)):
        out[:, exchange.FIELDS.index(name)] = values
    return out


class Loop:
    """Drives a controller as the callback does: the split of each step comes from the plans."""

    def __init__(self, controller, size, schedule, **bounds):
        self.c, self.spe = controller, len(schedule)
        self.plans = controller.start(size, np.asarray(schedule), **bounds)
        self.t = 0

    def step(self, make_row):
        """Run one step with its planned split; `make_row(sizes)` gives the gathered rows. Returns the split."""
        epoch, step = divmod(self.t, self.spe)
        sizes = self.plans.pop((epoch, step))
        key, decided, _ = self.c.decide(epoch, step, make_row(sizes), sizes)
        self.plans[key] = decided
        self.t += 1
        return sizes


@pytest.mark.parametrize("plan_ahead", [0, 1, 2])
def test_every_rank_decides_the_same_from_the_same_gathered_numbers(plan_ahead):
    rng = np.random.default_rng(0)
    loops = [Loop(BalanceController("lbbsp", warmup_steps=1, plan_ahead=plan_ahead), 3, [60] * 5 + [17])
             for _ in range(3)]
    for t in range(30):
        g = gathered(rng.uniform(10, 100, 3), rng.uniform(0.01, 0.1, 3))
        used = [loop.step(lambda sizes: g).tolist() for loop in loops]
        assert used[0] == used[1] == used[2]
        assert sum(used[0]) == (17 if t % 6 == 5 else 60)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_keeps_sum_and_bounds(name):
    loop = Loop(BalanceController(name, warmup_steps=0), 4, [40, 40, 40, 13], b_min=2, b_max=[30, 30, 30, 30])
    rng = np.random.default_rng(1)
    for t in range(24):
        b = loop.step(lambda sizes: gathered(rng.uniform(1, 9, 4), rng.uniform(0.1, 1, 4)))
        assert b.sum() == (13 if t % 4 == 3 else 40) and b.min() >= 2 and b.max() <= 30


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_keeps_to_the_batch_grid(name):
    """Full steps (64 samples) split into multiples of 8 whatever is measured; the short last step (45) into
    multiples too but for its remainder of 5, which goes out sample by sample."""
    loop = Loop(BalanceController(name, warmup_steps=0), 4, [64, 64, 64, 45], multiple=8)
    rng = np.random.default_rng(2)
    for t in range(24):
        v = rng.uniform(1, 9, 4)
        b = loop.step(lambda sizes: gathered(v, (2 + sizes) / v))
        assert b.sum() == (45 if t % 4 == 3 else 64) and b.min() >= 8
        assert int((b % 8).sum()) == (5 if t % 4 == 3 else 0), b


@pytest.mark.parametrize("name", ["pid", "lbbsp"])
@pytest.mark.parametrize("plan_ahead", [0, 1])
def test_work_moves_away_from_a_slow_worker(name, plan_ahead):
    v = np.array([100.0, 25.0])
    loop = Loop(BalanceController(name, warmup_steps=0, plan_ahead=plan_ahead), 2, [100] * 10)
    for _ in range(8):
        b = loop.step(lambda sizes: gathered(v, sizes / v))
    assert b.tolist() == [80, 20], name


def test_lbbsp_balances_fixed_costs_in_a_few_steps_where_speed_proportional_splits_do_not():
    # t_i(b) = (k + b) / v_i with k = 30 samples: proportional-to-samples/s balancing is off,
    # the step-time model finds the min-max split once two batch sizes were seen.
    v, k, B = np.array([400.0, 400.0, 200.0, 100.0]), 30.0, 400
    rng = np.random.default_rng(0)
    c = BalanceController(LBBSPPolicy(), warmup_steps=0)
    loop = Loop(c, 4, [B] * 50)
    best = (B + 4 * k) / v.sum()
    ratios = []
    for _ in range(14):
        b = loop.step(lambda sizes: gathered([np.nan] * 4, (k + sizes) / v * rng.uniform(0.99, 1.01, 4)))
        ratios.append(best / np.max((k + b) / v))
    assert min(ratios[6:]) >= 0.95, ratios
    assert c.policy.model.identified[2:].all()
    assert c.offsets()[3] == pytest.approx(k, rel=0.3)


def test_dbs_rebalances_once_per_epoch():
    loop = Loop(BalanceController("dbs", warmup_steps=0, plan_ahead=0), 2, [100] * 3)
    v = np.array([100.0, 25.0])
    for _ in range(3):
        assert loop.step(lambda sizes: gathered([1, 1], sizes / v)).tolist() == [50, 50]
    assert loop.step(lambda sizes: gathered([1, 1], sizes / v)).tolist() == [80, 20]


def test_missing_and_bad_measurements_keep_a_valid_split():
    loop = Loop(BalanceController("lbbsp", warmup_steps=0), 3, [30] * 10)
    for t in ([np.nan, 0.1, 0.1], [0.0, -1.0, np.inf], [np.nan] * 3, [0.1, 0.2, 0.3]):
        b = loop.step(lambda sizes: gathered([np.nan, -5.0, np.inf], t))
        assert b.sum() == 30 and b.min() >= 1


def test_state_round_trip_continues_identically():
    rng = np.random.default_rng(2)
    rows = [gathered(rng.uniform(10, 100, 3), rng.uniform(0.01, 0.1, 3)) for _ in range(20)]
    a = Loop(BalanceController("lbbsp", warmup_steps=0), 3, [60] * 10)
    for t in range(10):
        a.step(lambda sizes: rows[t])
    b = Loop(BalanceController("lbbsp", warmup_steps=0), 3, [60] * 10)
    b.c.load_state(a.c.state())
    b.plans, b.t = dict(a.plans), a.t
    for t in range(10, 20):
        assert a.step(lambda sizes: rows[t]).tolist() == b.step(lambda sizes: rows[t]).tolist()
    with pytest.raises(ValueError, match="policy 'lbbsp' cannot continue policy 'pid'"):
        Loop(BalanceController("pid"), 3, [60]).c.load_state(a.c.state())


def test_forecaster_falls_back_and_warns_once_per_kind(caplog):
    class Bad(EMAPredictor):
        def forecast(self):
            raise KeyError("nope")

    f = Forecaster(Bad())
    with caplog.at_level(logging.WARNING, logger="lbbsp"):
        assert np.isnan(f.update(10, float("nan")))
        assert f.update(50, 1.0) == 50.0
        assert f.update(60, 1.0, offset=10.0) == 70.0  # batch-free speed (b + k) / t
    assert f.failures == 3 and caplog.text.count("nope") == 1


def test_forecaster_treats_absurd_forecasts_like_nan(caplog):
    class Absurd(EMAPredictor):
        def _forecast(self):
            return 1e12

    f = Forecaster(Absurd())
    with caplog.at_level(logging.WARNING, logger="lbbsp"):
        assert f.update(100, 1.0) == 100.0
        assert f.update(120, 1.0) == 120.0
    assert "far outside" in caplog.text and f.failures == 2
    with pytest.raises(ValueError, match="absurd=1"):
        Forecaster("ema", absurd=1)


def test_step_log_streams_and_keeps_memory_flat(tmp_path):
    log = StepLog(tmp_path / "s.csv", keep=10, extra=("proc_cpu",))
    row = dict(time=1.0, epoch=0, step=0, rank=0, global_batch=10, batch_size=5, compute=0.1, wait=0.1,
               step_time=0.25, speed=50.0, offset=0.0, forecast=float("nan"), next_batch_size=5, efficiency=0.75,
               overhead=0.001, proc_cpu=0.5)
    for _ in range(100):
        log.add(dict(row), balanced=0.1, slowest=0.2)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(20000):
        log.add(dict(row), balanced=0.1, slowest=0.2)
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert grown < 200_000, grown
    summary = log.epoch_summary()
    assert summary["lbbsp_idle_fraction"] == pytest.approx(0.4) and summary["lbbsp_efficiency"] == pytest.approx(0.5)
    assert log.epoch_summary() == {}
    log.close()
    lines = (tmp_path / "s.csv").read_text().splitlines()
    assert len(lines) == 20101 and lines[0].startswith("time,epoch,step") and lines[0].endswith("proc_cpu")
    assert len(log.rows) == 10
    with pytest.raises(ValueError, match="keep=-1"):
        StepLog(keep=-1)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="policy='x'"):
        make_policy("x")
    with pytest.raises(ValueError, match="warmup_steps=-1"):
        BalanceController("equal", warmup_steps=-1)
    with pytest.raises(ValueError, match="plan_ahead=1.5"):
        BalanceController("equal", plan_ahead=1.5)
    with pytest.raises(ValueError, match="model=3"):
        LBBSPPolicy(model=3)
    with pytest.raises(ValueError, match="forgetting=1.0"):
        LBBSPPolicy(model={"forgetting": 1.0})


def test_lbbsp_follows_a_step_change_within_three_steps():
    # Worker 1's speed drops 4x at step 20 and comes back at step 40 (fixed cost 10 samples). The
    # forecasts lag as a smoothing forecaster's do (an EMA, one step old): the fresh fit must win.
    k, B = 10.0, 256

    def speeds(t):
        return np.array([1000.0, 250.0 if 20 <= t < 40 else 1000.0])

    loop = Loop(BalanceController(LBBSPPolicy(), warmup_steps=0), 2, [B] * 100)
    eta, ema, sent = [], speeds(0), speeds(0)
    for t in range(60):
        v = speeds(t)
        b = loop.step(lambda sizes: gathered(sent, (k + sizes) / v))
        sent, ema = ema, ema + 0.3 * (v - ema)
        eta.append(((B + 2 * k) / v.sum()) / np.max((k + b) / v))
    assert min(eta[23:40]) >= 0.9 and min(eta[43:60]) >= 0.9, np.round(eta, 2)


def test_calibration_dithers_until_the_fixed_costs_are_identified():
    # Two identical workers with a fixed cost of 30 samples: the equal split is balanced and never moves on its
    # own, so without the dither k stays at its prior 0, and a worker that later gets a small batch would look
    # slower than it is by (30 + b) / b. Worker 1 slows down 4x at step 24: with k known the first informed
    # split is the balanced one.
    k, B, rng = 30.0, 256, np.random.default_rng(1)

    def speeds(t):
        return np.array([5000.0, 5000.0 if t < 24 else 1250.0])

    results = {}
    for calibration in (0, 8):
        loop = Loop(BalanceController(LBBSPPolicy(calibration=calibration), warmup_steps=2), 2, [B] * 16,
                    multiple=8)
        splits, eta = [], []
        for t in range(32):
            b = loop.step(lambda sizes: gathered(np.full(2, np.nan),
                                                 (k + sizes) / speeds(t) * np.exp(rng.normal(0.0, 0.02, 2))))
            splits.append(b.tolist())
            eta.append(((B + 2 * k) / speeds(t).sum()) / np.max((k + b) / speeds(t)))
        results[calibration] = loop.c.policy.model, splits, eta
    model, splits, eta = results[8]
    assert all(sum(s) == B for s in splits) and splits[4] != splits[3] and splits[5] != splits[4], splits[:8]
    assert all(s == [128, 128] for s in splits[12:24]), splits  # the dither has ended
    before = model.offsets
    _, nocal_splits, nocal_eta = results[0]
    assert all(s == [128, 128] for s in nocal_splits[:24]), nocal_splits
    # The step-time model's k after the calibration, and what it buys two steps after the slow-down is seen.
    assert eta[27] >= 0.9 > nocal_eta[27], (np.round(eta[24:], 2), np.round(nocal_eta[24:], 2), before)
    for bad, message in ((-1, "calibration=-1"), (1.5, "calibration=1.5")):
        with pytest.raises(ValueError, match=message):
            LBBSPPolicy(calibration=bad)
    with pytest.raises(ValueError, match="dither=1.0"):
        LBBSPPolicy(dither=1.0)


def _moves(policy, speeds_of, steps=200, seed=0, noise=0.06, k=16.0, total=256, finest=None):
    """Split changes of `policy` on workers whose step times carry log-normal noise; and the last split."""
    rng = np.random.default_rng(seed)
    n = speeds_of(0).size
    batches, moves = policy.start(n, total, multiple=8, finest_multiple=finest), 0
    for step in range(steps):
        compute = (k + batches) / (speeds_of(step) * np.exp(rng.normal(0.0, noise, n)))
        stats = StepStats(step=step, batches=batches, compute=compute, wait=np.zeros(n),
                          forecast=np.full(n, np.nan), target=step + 1)
        new = policy.after_step(stats, total)
        moves += int(not np.array_equal(new, batches))
        batches = new
    return moves, batches


def test_noise_shrinkage_keeps_identical_workers_still_and_still_follows_real_differences():
    identical = lambda step: np.full(2, 1000.0)
    # Mean-only: the bias-corrected candidate of the default "auto" smooths the forecasts too.
    shrunk, _ = _moves(LBBSPPolicy(variance_aware=False), identical)
    every, _ = _moves(LBBSPPolicy(shrink_noise=False, variance_aware=False), identical)
    assert shrunk * 3 <= every and every >= 20, (shrunk, every)
    # Worker 1 at a third of the speed from step 50: the split follows it within three steps.
    _, after = _moves(LBBSPPolicy(), lambda step: np.array([1000.0, 1000.0 if step < 50 else 333.0]), steps=53)
    assert after[0] >= 2.5 * after[1], after
    with pytest.raises(ValueError, match="shrink_noise=1"):
        LBBSPPolicy(shrink_noise=1)


class _Clock:
    """A fake clock that a predictor advances by the time it 'takes'."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _slow_predictor(clock, seconds):
    class Slow(EMAPredictor):
        calls = 0

        def _forecast(self):
            Slow.calls += 1
            clock.now += seconds[0]
            return 2.0 * self.history.last_valid()  # recognisably not the last value

    return Slow()


def test_forecaster_over_budget_forecasts_the_last_speed_and_retimes_the_predictor(caplog):
    clock, seconds = _Clock(), [0.002]
    predictor = _slow_predictor(clock, seconds)
    f = Forecaster(predictor, budget=0.01, probe_every=4, clock=clock, cpu_clock=clock)
    with caplog.at_level(logging.INFO, logger="lbbsp"):
        out, wants = [], []
        for _ in range(13):  # 2 ms of a 100 ms step: over a 1% budget
            wants.append(f.wants_features)
            out.append(f.update(100, 0.1))
    # Timed five times, then the last measured speed (1000), the predictor again at every 4th step.
    assert out[:5] == [2000.0] * 5
    assert out[5:] == [1000.0, 1000.0, 1000.0, 2000.0, 1000.0, 1000.0, 1000.0, 2000.0]
    assert (f.model_steps, f.last_value_steps) == (7, 6) and type(predictor).calls == 7
    assert len(predictor.history) == 13  # it observed every step
    # Readings are wanted while the predictor runs, and then only for the steps it re-times on (its
    # window is this EMA's one step).
    assert wants == [True] * 6 + [False, False, True, False, False, False, True]
    assert "forecasting the last measured speed, re-timing it every 4 steps" in caplog.text
    seconds[0] = 0.0005  # cheaper (the worker got more CPU): back within budget after five re-timings
    for _ in range(12):
        f.update(100, 0.1)
    assert f.update(100, 0.1) == 2000.0 and f.cost == pytest.approx(0.0005)


def test_forecaster_within_budget_or_without_one_always_uses_the_predictor():
    for budget, step in ((0.01, 0.5), (None, 0.01)):
        clock = _Clock()
        f = Forecaster(_slow_predictor(clock, [0.002]), budget=budget, clock=clock, cpu_clock=clock)
        assert all(f.update(100, step) == 2.0 * 100 / step for _ in range(40))
        assert f.last_value_steps == 0 and f.model_steps == 40


def test_forecaster_budget_with_failing_timings_and_bad_values():
    clock = _Clock()
    f = Forecaster(_slow_predictor(clock, [0.002]), budget=0.0, clock=clock, cpu_clock=clock)
    for _ in range(6):
        f.update(100, float("nan"))  # no valid compute time yet: nothing to compare the cost with
    assert f.last_value_steps == 0
    f.update(100, 0.1)
    assert f.update(100, 0.1) == 1000.0  # budget 0: the last value except when re-timing
    for bad in (-0.1, "1%", True, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="forecast_budget="):
            Forecaster("ema", budget=bad)
    with pytest.raises(ValueError, match="probe_every=0"):
        Forecaster("ema", probe_every=0)


def test_forecaster_cost_counts_a_cpu_quota():
    # 0.2 ms of predictor on a 50 ms step is within a 1% budget on a whole core; under a 0.15-core
    # quota the same CPU time costs 0.2 / 0.15 = 1.3 ms of wall time on average, which is not.
    for share, uses_model in ((1.0, True), (0.15, False)):
        clock = _Clock()
        f = Forecaster(_slow_predictor(clock, [0.0002]), budget=0.01, clock=clock, cpu_clock=clock)
        out = [f.update(100, 0.05, cpu_share=share) for _ in range(8)]
        assert (out[-1] == 4000.0) is uses_model, (share, out)
    assert f.cost == pytest.approx(0.0002 / 0.15)
    f.update(100, 0.05, cpu_share=float("nan"))  # an unreadable share counts as a whole core
    assert f.cost == pytest.approx(0.0002)


def test_forecaster_cost_is_the_larger_of_wall_and_cpu_over_the_quota():
    wall, cpu = _Clock(), _Clock()

    class Shared(EMAPredictor):  # a hog shares the core: 0.1 ms of CPU takes 0.3 ms of wall time
        def _forecast(self):
            wall.now += 0.0003
            cpu.now += 0.0001
            return super()._forecast()

    f = Forecaster(Shared(), budget=0.01, clock=wall, cpu_clock=cpu)
    for _ in range(5):
        f.update(100, 0.02)
    assert f.cost == pytest.approx(0.0003)
    f.update(100, 0.02, cpu_share=0.2)  # a quota of 0.2 cores: 0.1 ms of CPU costs 0.5 ms on average
    assert f.cost == pytest.approx(0.0005)


def test_forecaster_counts_the_readings_a_feature_predictor_needs():
    # 0.6 ms of predictor on a 100 ms step is within a 1% budget; with 0.6 ms of readings it is not.
    # A predictor that reads no features is not charged for readings taken for something else.
    for uses_features, reading, gated in ((True, 0.0, False), (True, 0.0006, True), (False, 0.0006, False)):
        clock = _Clock()
        predictor = _slow_predictor(clock, [0.0006])
        predictor.uses_features = uses_features
        f = Forecaster(predictor, budget=0.01, clock=clock, cpu_clock=clock)
        for _ in range(8):
            f.update(100, 0.1, features=np.zeros(8), features_cost=(reading, reading))
        assert (f.last_value_steps > 0) is gated, (uses_features, reading)


def test_lbbsp_refines_the_default_grid_for_a_worker_best_below_its_floor():
    # Static-4-like: worker 3 at a tenth of the speed with a fixed cost is best at about 3 samples of 256.
    slow = lambda step: np.array([1000.0, 1000.0, 500.0, 100.0])
    policy = LBBSPPolicy()
    _, fixed = _moves(policy, slow, steps=40, noise=0.02)
    assert policy.multiple == 8 and fixed[3] == 8, fixed
    _, refined = _moves(policy, slow, steps=40, noise=0.02, finest=1)
    assert policy.multiple < 8 and refined[3] < 8 and refined.sum() == 256, (policy.multiple, refined)
    assert np.all(refined % policy.multiple == 0), refined
    _, bounded = _moves(policy, slow, steps=40, noise=0.02, finest=4)  # no finer than 4, as the feed's default
    assert policy.multiple == 4 and bounded[3] == 4, (policy.multiple, bounded)
    policy.start(4, 256, multiple=8, finest_multiple=1)  # a new run starts from the grid it is given
    assert policy.multiple == 8
    # Identical workers never sit at the floor: the grid stays.
    _moves(policy, lambda step: np.full(2, 1000.0), steps=40, finest=1)
    assert policy.multiple == 8
    for bad in (3, 0, 2.0, True):
        with pytest.raises(ValueError, match=f"finest_multiple={bad!r}"):
            policy.start(4, 256, multiple=8, finest_multiple=bad)
