"""The framework-free controller: guarded predictions, identical decisions on every rank, history."""
import logging

import numpy as np
import pytest

from lbbsp.controller import ROW_FIELDS, BalanceController, GuardedPredictor
from lbbsp.policies import POLICIES, make_policy
from predictor import EMAPredictor


def gathered(forecast, compute, wait=None):
    n = len(forecast)
    out = np.full((n, len(ROW_FIELDS)), np.nan)
    out[:, ROW_FIELDS.index("forecast")] = forecast
    out[:, ROW_FIELDS.index("compute")] = compute
    out[:, ROW_FIELDS.index("wait")] = 0.0 if wait is None else wait
    return out


def test_every_rank_decides_the_same_from_the_same_gathered_numbers():
    rng = np.random.default_rng(0)
    controllers = [BalanceController("lbbsp", "ema", warmup_steps=1) for _ in range(3)]
    for rank, c in enumerate(controllers):
        c.start(rank, 3, np.array([60] * 5 + [17]))
    for step in range(30):
        g = gathered(rng.uniform(10, 100, 3), rng.uniform(0.01, 0.1, 3))
        decisions = [c.decide(step // 6, step % 6, g)[0].tolist() for c in controllers]
        assert decisions[0] == decisions[1] == decisions[2]
        assert sum(decisions[0]) == (17 if step % 6 == 4 else 60)


@pytest.mark.parametrize("name", sorted(set(POLICIES) - {"oracle"}))
def test_every_policy_keeps_sum_and_bounds(name):
    c = BalanceController(name, "last", warmup_steps=0)
    c.start(0, 4, np.array([40, 40, 40, 13]), b_min=2, b_max=[30, 30, 30, 30])
    rng = np.random.default_rng(1)
    for step in range(24):
        b, _ = c.decide(step // 4, step % 4, gathered(rng.uniform(1, 9, 4), rng.uniform(0.1, 1, 4)))
        assert b.sum() == (13 if step % 4 == 2 else 40) and b.min() >= 2 and b.max() <= 30


def test_pid_and_lbbsp_move_work_away_from_a_slow_worker():
    for name, forecast in (("pid", [100.0, 25.0]), ("lbbsp", [100.0, 25.0])):
        c = BalanceController(name, "last", warmup_steps=0)
        c.start(0, 2, np.array([100] * 10))
        for step in range(5):
            b = c.batches
            b, _ = c.decide(0, step, gathered(forecast, b / np.array([100.0, 25.0])))
        assert b.tolist() == [80, 20], name


def test_dbs_rebalances_once_per_epoch():
    c = BalanceController("dbs", "last", warmup_steps=0)
    c.start(0, 2, np.array([100] * 3))
    for step in range(2):
        b, _ = c.decide(0, step, gathered([1, 1], np.array([50, 50]) / np.array([100.0, 25.0])))
        assert b.tolist() == [50, 50]
    b, _ = c.decide(0, 2, gathered([1, 1], np.array([50, 50]) / np.array([100.0, 25.0])))
    assert b.tolist() == [80, 20]


def test_oracle_without_true_speeds_is_a_clear_error():
    c = BalanceController("oracle", None, warmup_steps=0)
    c.start(0, 2, np.array([10]))
    with pytest.raises(ValueError, match="true speeds"):
        c.decide(0, 0, gathered([1, 1], [1, 1]))


def test_guarded_predictor_falls_back_and_warns_once(caplog):
    class Bad(EMAPredictor):
        def forecast(self):
            raise KeyError("nope")

    g = GuardedPredictor(Bad())
    with caplog.at_level(logging.WARNING, logger="lbbsp"):
        assert np.isnan(g.update(float("nan")))
        assert g.update(50.0) == 50.0
        assert g.update(60.0) == 60.0
    assert g.failures == 3 and caplog.text.count("nope") == 1


def test_guarded_predictor_restarts_when_the_batch_moves():
    g = GuardedPredictor("ema")
    for _ in range(10):
        g.update(100.0, batch=64)
    assert g.update(50.0, batch=64) == pytest.approx(85.0)  # smoothed within a regime
    assert g.update(40.0, batch=32) == 40.0  # new batch: a new regime, no smoothing over the old one
    assert g.restarts == 1
    with pytest.raises(ValueError, match="batch_reset=0"):
        GuardedPredictor("ema", batch_reset=0)


def test_history_and_epoch_summary(tmp_path):
    c = BalanceController("equal", None, warmup_steps=0)
    c.start(0, 2, np.array([10, 10]))
    for step in range(2):
        c.decide(0, step, gathered([1, 1], [0.1, 0.2]))
        c.record(time=1.0, epoch=0, step=step, rank=0, global_batch=10, batch=5, compute=0.1, wait=0.1,
                 step_time=0.25, speed=50.0, forecast=float("nan"), next_batch=5, efficiency=0.75,
                 overhead=0.001, features=np.zeros(8))
    summary = c.epoch_summary()
    assert summary["lbbsp_idle_fraction"] == pytest.approx(0.4) and summary["lbbsp_efficiency"] == pytest.approx(2 / 3)
    c.write_csv(tmp_path / "h.csv")
    lines = (tmp_path / "h.csv").read_text().splitlines()
    assert len(lines) == 3 and lines[0].startswith("time,epoch,step") and "proc_cpu" in lines[0]
    with pytest.raises(ValueError, match="policy='x'"):
        make_policy("x")
