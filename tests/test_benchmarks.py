"""Benchmark machinery: scenarios, figures, curves and the oracle, the simulator, and a real short comparison."""
import csv
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.analysis import breakdown, recovery, recovery_kinds, summarize
from benchmarks.oracle import MIN_NOISE_STEPS, CurveBook, OraclePolicy, fit_curves, one_size
from benchmarks.progress import Progress
from benchmarks.replay import replay
from benchmarks.variants import VARIANTS, worker_options
from benchmarks.worker import make_policy
from benchmarks.worker import parse as parse_worker
from benchmarks.scenario import Scenario, list_scenarios
from benchmarks.decision import decision_times
from benchmarks.simulate import LOW_NOISE_SPREAD, Cluster, _blocks, noise_stats, simulate, tail_speeds
from lbbsp import exchange
from lbbsp.allocation import Bounds
from lbbsp.controller import BalanceController
from lbbsp.metrics import balanced_time
from lbbsp.policies import LBBSPPolicy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_shipped_scenarios_load():
    names = list_scenarios()
    assert {"static-4", "static-4-mlp", "dynamic-2", "step-change-2", "homogeneous-2", "homogeneous-2-mlp",
            "accuracy-2", "slowed-2", "shared-2"} <= set(names)
    for name in names:
        s = Scenario.load(name)
        assert len(s.speeds) == s.workers and s.states(0)
    d = Scenario.load("dynamic-2")
    assert d.cores_given(1, 5) == pytest.approx(0.33 * 0.9) and d.state(0, 21) == (1.0, True)
    assert d.cores_given(0, 21) == pytest.approx(0.5), "a hog leaves half the core"
    assert d.state(1, 48 + 5) == d.state(1, 5) and d.state(0, 48 + 29) == (1.0, False), "the pattern repeats"
    assert Scenario.load("step-change-2").states(1) == [(0.25, False), (1.0, False)]
    shared = Scenario.load("shared-2")
    assert shared.cores_given(0, 9) == 1.0 and shared.cores_given(1, 0) == pytest.approx(0.5), "no quota binds"


@pytest.mark.parametrize("patch, message", [
    ({"workers": 0}, "workers=0"),
    ({"speeds": [1, 2]}, "speeds=[1, 2]"),
    ({"workload": "resnet"}, "workload='resnet'"),
    ({"events": [{"step": 1, "worker": 9, "speed": 0.5}]}, "event"),
    ({"events": [{"step": 1.5, "worker": 0, "speed": 0.5}]}, "event"),
    ({"epochs": 1}, "epochs=1"),
    ({"num_samples": 10}, "num_samples=10"),
    ({"period": 1, "events": [{"step": 1, "worker": 0, "speed": 0.5}]}, "period=1"),
])
def test_bad_scenarios_name_the_value(patch, message):
    data = {"name": "x", "workers": 2, "workload": "mlp", "global_batch": 64, "epochs": 3, "scale": 0.5,
            "speeds": [1, 0.5]}
    data.update(patch)
    with pytest.raises(ValueError, match=re.escape(message)):
        Scenario(data)
    with pytest.raises(ValueError, match="scenario='nope'"):
        Scenario.load("nope")


def rows(batches, computes, waits):
    return [{"epoch": 1, "step": i, "batch_size": b, "compute": c, "wait": w, "step_time": c + w, "overhead": 1e-4,
             "throttled": 0.0} for i, (b, c, w) in enumerate(zip(batches, computes, waits))]


def test_summary_figures_and_breakdown_from_histories():
    # Worker 1 is twice as slow per sample and gets equal batches: eta = T*/T = (2/3) / 1.
    histories = [rows([10, 10], [0.5, 0.5], [0.6, 0.6]), rows([10, 10], [1.0, 1.0], [0.1, 0.1])]
    epochs = [{"time": 9.0}, {"time": 2.0}, {"time": 2.0}]
    s = summarize(histories, epochs, 20, 2)
    assert s["epoch_time"] == 2.0 and s["throughput"] == 10.0 and s["step_time"] == 1.0
    assert s["efficiency"] == pytest.approx(2 / 3) and s["straggler"] == pytest.approx(0.5 / 0.75)
    assert s["idle_fraction"] == pytest.approx(0.7 / 2.2) and s["mean_batch"] == [10.0, 10.0]
    parts = breakdown(histories)
    assert parts["allreduce"] == [100.0, 100.0] and parts["waiting"] == [500.0, 0.0]
    assert parts["compute"] == [500.0, 1000.0] and parts["plugin"] == [0.1, 0.1]


def test_recovery_follows_the_step_efficiency_from_each_change_of_contention():
    n = 12
    speeds = [1.0] * 3 + [0.25] * 6 + [1.0] * 3  # worker 1 slowed at step 3, restored at step 9
    computes = [1.0] * 3 + [4.0, 4.0] + [1.0] * 7  # its batch is cut two steps after the change
    batches = [10] * 5 + [2.5] * 4 + [10] * 3
    fast = rows([10] * n, [1.0] * n, [0.0] * n)
    slow = rows(batches, computes, [0.0] * n)
    for row in fast:
        row.update(state_speed=1.0, state_hog=False)
    for i, row in enumerate(slow):
        row.update(state_speed=speeds[i], state_hog=False)
    out = recovery([fast, slow], skip_epochs=1, steps=4)
    assert out == [[pytest.approx(0.4), pytest.approx(0.4), 1.0, 1.0]], "the change at 9 has too few steps after it"
    assert len(recovery([fast, slow], skip_epochs=1, steps=3)) == 2
    assert recovery_kinds([fast, slow], skip_epochs=1, steps=4) == ["slower"]
    assert recovery_kinds([fast, slow], skip_epochs=1, steps=3) == ["slower", "faster"]
    fast[9]["state_hog"] = True  # a hog starts on worker 0 as worker 1's quota is restored
    assert recovery_kinds([fast, slow], skip_epochs=1, steps=3) == ["slower", "mixed"]
    assert recovery([rows([10], [1.0], [0.0])] * 2) == [], "no recorded states, no changes"
    assert recovery_kinds([rows([10], [1.0], [0.0])] * 2) == []


def test_curves_oracle_and_reachable_ideal():
    s = Scenario({"name": "x", "workers": 2, "workload": "conv", "global_batch": 64, "epochs": 2, "scale": 1.0,
                  "speeds": [1, 1], "period": 10, "events": [{"step": 5, "worker": 1, "speed": 0.25}]})
    rng = np.random.default_rng(0)
    records = []
    for worker, speed, c, u in ((0, 1.0, 0.01, 0.001), (1, 1.0, 0.01, 0.001), (1, 0.25, 0.04, 0.004)):
        for b in rng.integers(5, 60, 20):
            records.append((worker, speed, False, float(b), c + u * b * rng.uniform(0.99, 1.01)))
    records.append((1, 0.25, False, 30.0, 9.0))  # an outlier (a stall) does not bend the line
    curves = fit_curves(records)
    assert curves[(1, "0.25|0")] == pytest.approx((0.04, 0.004), rel=0.05)
    assert one_size(records) == {}
    held = [(2, 0.25, True, 8.0, 0.046)] * 5  # a worker that only ever ran 8 samples: a line through the origin
    assert one_size(records + held) == {(2, "0.25|1"): 8}
    assert fit_curves(held)[(2, "0.25|1")] == pytest.approx((0.0, 0.046 / 8))
    book = CurveBook(s, curves)
    k, v = book.at(6)
    assert k == pytest.approx([10.0, 10.0], rel=0.1) and v == pytest.approx([1000.0, 250.0], rel=0.05)
    assert book.reachable_step(6, 64) < book.equal_step(6, 64)
    split, per_step = book.best_static_split(range(10), 64)
    assert split.sum() == 64 and per_step >= np.mean([book.reachable_step(t, 64) for t in range(10)]) - 1e-12
    c = BalanceController(OraclePolicy(book.at), warmup_steps=0)
    plans = c.start(np.array([64] * 20), Bounds.of(2, 64))
    assert plans[0].sizes.tolist() == [32, 32]
    for step in range(5):
        plan, _ = c.decide(0, step, exchange.empty(2), plans[0].sizes)
    assert plan.key == (0, 6) and plan.sizes[1] < plan.sizes[0], "the oracle knows worker 1 is slow at step 6"
    with pytest.raises(ValueError, match="no measured curve"):
        CurveBook(s, {})


def test_reachable_ideal_under_the_measured_noise():
    s = Scenario({"name": "x", "workers": 2, "workload": "conv", "global_batch": 64, "epochs": 2, "scale": 1.0,
                  "speeds": [1, 0.5]})
    curves = {(0, "1|0"): (0.01, 0.001), (1, "0.5|0"): (0.01, 0.002)}
    quiet = [[((1.0, False), 32.0, 0.01 + 0.032), ((0.5, False), 32.0, 0.01 + 0.064)]] * MIN_NOISE_STEPS
    book = CurveBook(s, curves, quiet)
    assert book.noisy_reachable_step(3, 64) == pytest.approx(book.reachable_step(3, 64))
    # Worker 1's steps scatter by +-50% around its curve (mean one): the expected slowest finish is later,
    # and the split that minimises it gives worker 1 less than the mean curves do.
    rng = np.random.default_rng(0)
    noisy = [[((1.0, False), 20.0, 0.03), ((0.5, False), 44.0, 0.098 * f)] for f in rng.choice([0.5, 1.5], 400)]
    book = CurveBook(s, curves, noisy)
    k, v = book.at(3)

    def finish(b, f):
        return max((k[0] + 64 - b) / v[0], (k[1] + b) / v[1] * f)

    plain = min(range(1, 64), key=lambda b: finish(b, 1.0))
    best = min(range(1, 64), key=lambda b: finish(b, 0.5) + finish(b, 1.5))
    assert best < plain
    assert book.noisy_reachable_step(3, 64) == pytest.approx((finish(best, 0.5) + finish(best, 1.5)) / 2, rel=0.02)
    assert book.noisy_reachable_step(3, 64) > book.reachable_step(3, 64)
    # The efficiency that split shows under the same noise: below 1, since the draw unbalances its steps.
    balanced, slowest = book.noisy_ideal_efficiency(3, 64)
    split = np.array([64 - best, best])
    compute = (k + split) / v * np.array([[1.0, 0.5], [1.0, 1.5]])
    assert slowest / len(noisy) == pytest.approx(book.noisy_reachable_step(3, 64))
    assert balanced / slowest == pytest.approx(balanced_time(np.stack([split, split]), compute).sum() /
                                               compute.max(axis=1).sum(), rel=0.05)
    assert balanced / slowest < 0.9
    balanced, slowest = CurveBook(s, curves, quiet).noisy_ideal_efficiency(3, 64)
    assert balanced / slowest > 0.99
    book = CurveBook(s, curves, noisy[:MIN_NOISE_STEPS - 1] + [noisy[0][:1]])  # too few; one step lacks a worker
    with pytest.raises(ValueError, match=f"{MIN_NOISE_STEPS - 1} measured steps"):
        book.noisy_reachable_step(3, 64)
    with pytest.raises(ValueError, match=f"{MIN_NOISE_STEPS - 1} measured steps"):
        book.noisy_ideal_efficiency(3, 64)


def test_simulator_at_1024_workers_uses_the_real_policy_code():
    cluster = Cluster(1024, 40, seed=1)
    equal = simulate(cluster, "equal", None, 64 * 1024)
    oracle = simulate(cluster, "oracle", None, 64 * 1024)
    lbbsp = simulate(cluster, "lbbsp", "ema", 64 * 1024)
    assert oracle["step_time"][5:].mean() <= lbbsp["step_time"][5:].mean() < equal["step_time"][10:].mean()
    assert np.median(oracle["decide"]) < 5e-3


@pytest.mark.parametrize("profile", ["recorded", "replayed"])
def test_mean_oracles_know_the_noise_distribution_not_this_runs_draws(profile):
    low = Cluster(32, 60, seed=2, profile="low-noise")
    np.testing.assert_allclose(low.spread, LOW_NOISE_SPREAD)
    recorded = Cluster(32, 60, seed=2, profile=profile)
    again = Cluster(32, 200, seed=2, profile=profile)  # the same source traces for the same seed, a longer window
    np.testing.assert_array_equal(recorded.spread, again.spread)
    runs = {name: simulate(recorded, name, None, 64 * 32)["eta"][10:].mean()
            for name in ("equal", "mean-oracle", "lagged-mean-oracle", "oracle")}
    assert runs["equal"] < runs["lagged-mean-oracle"] <= runs["mean-oracle"] <= runs["oracle"] == 1.0
    stats = noise_stats(recorded, 64 * 32)
    assert 0.0 <= stats["floor"] <= 1.0 and stats["spread"] > 0


def test_tail_oracle_plans_each_worker_at_its_own_noise_quantile():
    recorded = Cluster(128, 80, seed=4)
    # The quantile at 1 - 1/N of each worker's time noise comes from its source's deviations, not this run's draws.
    np.testing.assert_array_equal(recorded.tail, Cluster(128, 200, seed=4).tail)
    assert (recorded.tail > 0).all() and np.ptp(recorded.tail / recorded.spread) > 1.0, "tails differ in shape"
    runs = {name: simulate(recorded, name, None, 512 * 128)["eta"][20:].mean()
            for name in ("mean-oracle", "tail-oracle", "oracle")}
    assert runs["mean-oracle"] < runs["tail-oracle"] < runs["oracle"]
    # Alike tails (one distribution for every worker): the quantile is the same for all, so is the split.
    low = Cluster(16, 40, seed=4, profile="low-noise")
    assert np.ptp(low.tail) == 0 and 0.03 < low.tail[0] < 0.1, "at 16 workers, jitter (1.5 sigma)"
    np.testing.assert_array_equal(*(simulate(low, name, None, 64 * 16)["eta"]
                                    for name in ("mean-oracle", "tail-oracle")))
    tail = Cluster(1024, 20, seed=4, profile="low-noise").tail
    assert np.log(2) - 0.1 < tail[0] < np.log(2) + 0.1, "at 1024 workers, the stragglers of 0.3% of steps"


def test_recorded_noise_is_resampled_around_the_same_contention_as_low_noise():
    recorded = Cluster(48, 1600, seed=3)
    low = Cluster(48, 1600, seed=3, profile="low-noise")
    # Both profiles draw around one mean path: the replayed traces' contention.
    np.testing.assert_array_equal(recorded.mean, low.mean)
    np.testing.assert_allclose(recorded.speed, recorded.mean * np.exp(recorded.noise))
    # The noise has its source trace's spread, and the blocks keep its short-term autocorrelation.
    ratio = recorded.noise.std(axis=0) / recorded.spread
    assert 0.8 < np.median(ratio) < 1.25
    assert noise_stats(recorded, 64 * 48)["lag1"] > 0.3 > noise_stats(low, 64 * 48)["lag1"]
    with pytest.raises(ValueError, match="profile='gpu'"):
        Cluster(4, 30, profile="gpu")


def _trailing_planner(cluster, steps=3):
    """A causal planner: the true noise spreads and the geometric mean of the last `steps` measured speeds
    (those of step t - 2 and before plan step t, as in the callback)."""
    def truth(step):
        last = max(step - 2, 0)
        speeds = np.exp(np.log(cluster.speed[max(last - steps + 1, 0):last + 1]).mean(axis=0))
        return np.full(cluster.num_workers, cluster.offset), tail_speeds(speeds, cluster.spread)
    return OraclePolicy(truth)


@pytest.mark.parametrize("profile, reachable", [("recorded", True), ("replayed", False)])
def test_the_mean_oracle_is_a_reachable_bound_only_where_the_noise_is_drawn_apart_from_the_mean(profile, reachable):
    cluster = Cluster(128, 120, seed=0, profile=profile)
    eta = {name: simulate(cluster, policy, None, 512 * 128)["eta"][20:].mean()
           for name, policy in (("trailing", _trailing_planner(cluster)), ("mean-oracle", "mean-oracle"))}
    # The replayed mean averages the draw with its neighbours: that oracle partly knows the draw.
    assert (eta["trailing"] / eta["mean-oracle"] > 0.85) == reachable


def test_noise_blocks_are_runs_of_consecutive_deviations():
    deviations = np.arange(100.0)
    out = _blocks(np.random.default_rng(0), deviations, 30, 8)
    assert out.shape == (30,)
    for start in range(0, 30, 8):
        block = out[start:start + 8]
        np.testing.assert_array_equal(np.diff(block), 1.0)
    np.testing.assert_array_equal(out, _blocks(np.random.default_rng(0), deviations, 30, 8))
    assert _blocks(np.random.default_rng(1), np.arange(5.0), 12, 8).max() <= 4.0, "a trace shorter than a block"


def test_small_batches_make_a_wide_cluster_floor_bound():
    cluster = Cluster(256, 30, seed=0)
    assert noise_stats(cluster, 64 * 256)["floor"] > noise_stats(cluster, 512 * 256)["floor"]


def test_simulator_plots_eta_against_cluster_size(tmp_path, capsys):
    from benchmarks.simulate import main

    path = tmp_path / "scaling.png"
    assert main(["--workers", "4,8", "--steps", "30", "--policies", "equal,mean-oracle,lagged-mean-oracle,tail-oracle",
                 "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    assert path.stat().st_size > 1000 and "lagged-mean-oracle" in out and "floor-bound steps" in out
    tail = next(line for line in out.splitlines() if " tail-oracle " in line and line.split()[0] == "8").split()
    assert float(tail[5]) == 1.0 and float(tail[4]) >= 1.0, "each policy as a fraction of the mean and tail oracles"


def test_simulator_gives_median_and_range_over_seeds(capsys):
    from benchmarks.simulate import main

    assert main(["--workers", "4", "--steps", "30", "--profiles", "low-noise", "--policies", "equal,mean-oracle",
                 "--seeds", "0,1,2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sum("(seed " in line for line in out) == 3
    row = next(line for line in out if " equal " in line)
    eta, low, high = (float(x) for x in row.split()[3].split() + row.split()[4].strip("[]").split("-"))
    assert low <= eta <= high and low < high
    with pytest.raises(SystemExit):
        main(["--workers", "4", "--seeds", "1,1"])


def test_decision_benchmark_times_every_policy():
    times = decision_times(LBBSPPolicy(), 8, steps=40, skip=10)
    assert times.shape == (30,) and np.all(times > 0)


def test_plumbing_benchmark_drives_a_rank_step_by_step_and_prints_its_cost(capsys):
    from benchmarks import plumbing
    cpu, switches = plumbing.per_step("lbbsp", num_workers=3, steps=60)
    assert 0 < cpu < 0.05 and switches >= 0
    assert plumbing.main(["--policies", "equal,pid", "--steps", "30", "--rounds", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["equal", "pid"] and all(float(row[1]) > 0 for row in rows)
    with pytest.raises(SystemExit):
        plumbing.main(["--steps", "5"])


def test_gpu_profile_is_the_measured_curve_with_set_ups_for_new_shapes():
    from benchmarks.gpusim import GPUCluster, GPUProfile

    profile = GPUProfile()
    # The H200's ResNet-50: a floor of ~15 ms up to ~50 samples, then ~0.19 ms per sample (0.43 under a
    # full-time co-tenant), as in ../gpu/README.md.
    assert 0.013 < profile.floor < 0.017 and 0.17e-3 < profile.slopes[0] < 0.21e-3 < profile.slopes[-1]
    assert profile.mean_time(32, 0.0, 1.0) == profile.floor and profile.mean_time(256, 0.0, 1.0) > 0.05
    cluster = GPUCluster(4, 20, "classes", 4 * 64, seed=1)
    first = cluster.compute_times(0, np.full(4, 64))
    assert first.max() < 1.0, "the equal split's shape is set up before the run"
    moved = cluster.compute_times(1, np.array([72, 56, 64, 64]))
    assert moved[0] > 3.0 and moved[1] > 3.0 and moved[2] < 1.0 and cluster.setups == 2
    assert cluster.compute_times(2, np.array([72, 56, 64, 64])).max() < 1.0, "a shape is set up once"
    k, v, f = cluster.mean_truth(3)
    assert (f == profile.floor).all() and np.isfinite(k).all() and (v > 0).all()
    with pytest.raises(ValueError, match="kind='mixed'"):
        GPUCluster(4, 20, "mixed", 256)
    # The H100's (docs/gpu.md): a higher, noisier floor (~23 ms with the batch changing every step), a steeper line.
    h100 = GPUProfile("h100")
    assert 0.020 < h100.floor < 0.026 and 0.19e-3 < h100.slopes[0] < 0.23e-3 < h100.slopes[-1]
    with pytest.raises(ValueError, match="card='a100'"):
        GPUProfile("a100")
    from benchmarks.gpusim import CARDS
    from predictor import gpu_traces
    assert set(CARDS) == set(gpu_traces.CARDS), "every card whose traces ship has the simulator's constants"


def test_gpu_simulation_keeps_floor_bound_gpus_equal_and_balances_generations(capsys):
    from benchmarks.gpusim import main, run_cell

    homogeneous = run_cell(8, "homogeneous", 32, 300, 150, policies=("equal", "lbbsp-last"))
    assert homogeneous["lbbsp-last"][1] == 0, "no shape beyond the equal split's"
    assert homogeneous["lbbsp-last"][0] <= 1.01 * homogeneous["equal"][0]
    classes = run_cell(8, "classes", 256, 300, 150, policies=("equal", "lbbsp-last"))
    assert classes["lbbsp-last"][0] < 0.9 * classes["equal"][0] and classes["lbbsp-last"][1] <= 8
    assert main(["--workers", "4", "--kinds", "cotenants", "--batches", "128", "--steps", "60",
                 "--policies", "equal,lbbsp-last"]) == 0
    assert "cotenants" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--batches", "30"])


def test_co_tenant_gpus_buy_no_shapes_on_the_tails_pessimism():
    # 64 ResNet-50 GPUs at 256 each, co-located jobs coming and going: the tail split, planned for the noisiest
    # workers' slow steps, predicts savings the mean speeds do not give; paid from those, a move's set-ups
    # (3-5.5 s) cost more than it saves.
    from benchmarks.gpusim import run_cell

    cell = run_cell(64, "cotenants", 256, 300, 500, policies=("equal", "lbbsp-narx"))
    assert cell["lbbsp-narx"][1] == 0 and cell["lbbsp-narx"][0] <= 1.01 * cell["equal"][0], cell


def test_warmed_gpus_on_their_floor_beside_co_tenants_stay_at_equal_batches_time():
    # 16 ResNet-50 GPUs at 32 each (on the floor) with every shape set up before the run, co-located jobs
    # coming and going: a GPU on its floor seldom has a fit of k precise enough to take alone, and with k = 0
    # its floor's noise read as speed and moved the split (1.07 of equal batches' time here; 1.14-1.19 at 64
    # GPUs). With the others' fits pooled it is planned with their k.
    from benchmarks.gpusim import run_cell

    cell = run_cell(16, "cotenants", 32, 300, 150, policies=("equal", "lbbsp-narx"), warm=True)
    assert cell["lbbsp-narx"][0] <= 1.015 * cell["equal"][0], cell


def test_co_tenant_gpus_whose_decisions_are_held_still_buy_no_shapes():
    # The same with 3 ms decisions: the decision budget holds each split for several steps, and the forgone
    # saving that pays for set-ups accrues per step elapsed, not per step the coming period holds (crediting the
    # period ahead bought 16 shapes here and ran at 1.19 of equal batches' time).
    from benchmarks.gpusim import run_cell

    cell = run_cell(8, "cotenants", 256, 1000, 500, policies=("equal", "lbbsp-narx"), decision_seconds=0.003)
    assert cell["lbbsp-narx"][1] == 0 and cell["lbbsp-narx"][0] <= 1.01 * cell["equal"][0], cell


def test_h100_speed_classes_pay_for_their_shapes_among_stray_slow_steps():
    # 8 H100s of three speed classes at 256 each. The H100's steps include stray slow ones (about one in twenty
    # above the floor 1.1-2.1x slow); judging whether a move is still worth making by half the newest best split's
    # saving restarted the forgone saving at many of them, and the split stayed equal (1.000 of equal's time).
    from benchmarks.gpusim import GPUProfile, run_cell

    cell = run_cell(8, "classes", 256, 1000, 500, policies=("equal", "lbbsp-narx"), profile=GPUProfile("h100"))
    assert cell["lbbsp-narx"][0] < 0.8 * cell["equal"][0] and cell["lbbsp-narx"][1] <= 8, cell


def test_a_cfs_quota_runs_its_share_of_each_period_then_stalls():
    from benchmarks.stepchange import PERIOD, QuotaWorker

    worker = QuotaWorker()
    # 30 ms of CPU under a quarter core: 25 ms now, a stall to the period's end, then 5 ms.
    assert worker.advance(0.030, 0.25, busy=True) == pytest.approx(PERIOD + 0.005)
    assert worker.advance(0.010, 0.25, busy=True) == pytest.approx(0.010), "the new period's quota has room"
    worker.advance(0.085, 0.25, busy=False)
    assert worker.advance(0.002, 0.25, busy=True) == pytest.approx(0.002), "idling into a new period refills it"
    assert QuotaWorker().advance(0.050, 1.0, busy=True) == pytest.approx(0.050), "a whole core never stalls"


def test_step_change_simulation_separates_smooth_changes_from_cfs_stalls(capsys):
    from benchmarks.stepchange import POLICIES, main, phase_oracle, run

    make, predictor = POLICIES["lbbsp-last"]
    smooth = run(make(), predictor, mode="smooth", steps=160)
    assert len(smooth["cut"]) == len(smooth["restore"]) == 4
    # Without stalls a 4x change is balanced again by the first split that knows of it (+2), both ways, once the
    # fixed cost is known (the first cut is where the batches first move); PID, which moves each batch by its
    # measured time ratio, is not. (The tail split's spreads remember the changes' planning errors for about 200
    # steps: the slack they give can cost a few points at +2.)
    changes = np.array(smooth["cut"][1:] + smooth["restore"])
    assert changes[:, 2].min() > 0.85 and np.median(changes[:, 2:]) > 0.95
    make_pid, _ = POLICIES["pid"]
    pid = run(make_pid(), mode="smooth", steps=160)
    assert np.median(np.array(pid["cut"] + pid["restore"])[:, 2]) < 0.9
    cfs = run(make(), predictor, mode="cfs", steps=160)
    assert cfs["step"] > smooth["step"]
    slowed, normal, step = phase_oracle("smooth", [0], steps=160)
    assert slowed < normal and step <= smooth["step"] * 1.01
    assert main(["--modes", "smooth", "--policies", "pid", "--seeds", "0", "--steps", "96"]) == 0
    assert "phase oracle" in capsys.readouterr().out
    with pytest.raises(ValueError, match="mode='gpu'"):
        run("equal", mode="gpu")
    with pytest.raises(SystemExit):
        main(["--modes", "gpu"])


def test_progress_prints_one_line_per_unit_in_a_log(capsys):
    p = Progress(total=2, parts=3, stream=sys.stderr)
    p.update("a", 1)
    p.finished("a", "1.0 s/epoch")
    p.finished("b")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("1/2 a 1.0 s/epoch")


def test_compare_runs_policies_under_horovodrun(tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text("name: tiny\nworkers: 2\nworkload: mlp\nglobal_batch: 256\nnum_samples: 4096\nepochs: 2\n"
                        "hidden: 64\nscale: 1.0\nspeeds: [1, 0.5]\nperiod: 16\n"
                        "events:\n  - {step: 2, worker: 1, speed: 0.25}\n  - {step: 12, worker: 1, speed: 0.5}\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.compare", "--scenario", str(scenario), "--variants",
                           "horovod,equal,lbbsp-narx,oracle", "--repeats", "2", "--out", str(tmp_path / "out"),
                           "--emulate"],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    out = proc.stdout
    assert "| lbbsp-narx |" in out and "emulated" in out and "reachable ideal" in out
    assert out.index("| horovod |") < out.index("| equal |"), "plain Horovod is the first row"
    assert len(re.findall(r"^\d/8 ", out, flags=re.M)) == 8, "one progress line per run in a log"
    results = json.loads((tmp_path / "out" / "tiny" / "results.json").read_text())["results"]
    assert set(results) == {"horovod", "equal", "lbbsp-narx", "oracle"} and all(len(r) == 2 for r in results.values())
    assert results["lbbsp-narx"][0]["heterogeneity"].startswith("emulated")
    assert all(len(r["model_share"]) == 2 and all(0 <= v <= 1 for v in r["model_share"])
               for r in results["lbbsp-narx"]), "per rank: the share of forecasts the NARX made"
    assert results["oracle"][1]["mean_batch"][1] < results["oracle"][1]["mean_batch"][0]
    assert [len(seq) for seq in results["lbbsp-narx"][0]["recovery"]] == [8], "one change with 8 steps after it"
    assert results["lbbsp-narx"][0]["recovery_kinds"] == ["slower"], "the quota cut at step 18"
    assert "Step efficiency after each change of contention" in out and "| lbbsp-narx | slower | 2 |" in out
    assert (tmp_path / "out" / "tiny" / "epoch_time_and_idle.png").stat().st_size > 1000
    assert (tmp_path / "out" / "tiny" / "lbbsp-narx" / "r1" / "steps_rank1.csv").exists()
    again = subprocess.run([sys.executable, "-m", "benchmarks.compare", "--scenario", str(scenario), "--out",
                            str(tmp_path / "out"), "--table-only", "--no-plots"],
                           cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert again.returncode == 0 and not re.search(r"^\d/8 ", again.stdout, flags=re.M), again.stdout[-4000:]
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert rows == [line for line in again.stdout.splitlines() if line.startswith("| ")], "the same tables anew"
    assert "| *reachable ideal, measured noise* |" in out and "Eta of the measured-noise ideal's split" in out
    # Offline, the rows the ranks gathered give every decision they took, bit for bit.
    for variant in ("lbbsp-narx", "equal"):
        replayed = subprocess.run([sys.executable, "-m", "benchmarks.replay",
                                   str(tmp_path / "out" / "tiny" / variant / "r1")],
                                  cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert replayed.returncode == 0, replayed.stdout[-4000:]
        assert re.search(rf"^{variant}: ([1-9]\d*) of \1 decisions match", replayed.stdout, flags=re.M), replayed.stdout
        assert (" speed " in replayed.stdout) == (variant == "lbbsp-narx"), "what lbbsp's step-time model saw"
    summary = json.loads((tmp_path / "out" / "tiny" / "lbbsp-narx" / "r1" / "summary.json").read_text())
    assert summary["grid"] == 1, "the batch grid the run kept (any size on CPU workers), for the replay"
    missing = subprocess.run([sys.executable, "-m", "benchmarks.compare", "--scenario", str(scenario), "--out",
                              str(tmp_path / "none"), "--table-only"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert missing.returncode == 2 and "results.json" in missing.stdout


def test_replay_refuses_a_folder_without_steps_and_a_variant_without_timed_splits(tmp_path, capsys):
    from benchmarks.replay import main

    with pytest.raises(ValueError, match="holds no steps_rank"):
        replay(str(tmp_path))
    with pytest.raises(ValueError, match="variant='horovod' is not allowed"):
        replay(str(tmp_path), variant="horovod")
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--grid", "0"])
    assert "--grid=0 is not allowed" in capsys.readouterr().err


def test_pipeline_benchmark_compares_both_pipelines_without_horovod(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.pipeline", "--samples", "128", "--batch", "16",
                           "--rounds", "1", "--dir", str(tmp_path / "images")], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = re.findall(r"^(images|trivial)\s+([01])\s+([\d.]+) \[.*?\]\s+([\d.]+) \[.*?\]\s+([+-][\d.]+)$",
                      proc.stdout, flags=re.M)
    assert len(rows) == 4, proc.stdout[-2000:]
    for _, _, horovod, lbbsp, extra in rows:
        assert float(horovod) > 0 and float(lbbsp) > 0
        assert abs(float(lbbsp) - float(horovod) - float(extra)) < 0.011
    assert len(list((tmp_path / "images").glob("*.png"))) == 128
    bad = subprocess.run([sys.executable, "-m", "benchmarks.pipeline", "--batch", "0"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert bad.returncode == 2 and "--batch=0" in bad.stdout


def test_shapes_benchmark_runs_each_case_in_its_own_process():
    from benchmarks.shapes import batch_sizes

    assert set(batch_sizes("grid", 64, 200, 8).tolist()) == set(range(32, 97, 8))
    fresh = batch_sizes("fresh", 64, 60, 8)
    assert len(set(fresh.tolist())) == 60 and fresh.min() >= 32 and fresh.max() <= 96
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.shapes", "--workload", "mlp", "--batch", "24",
                           "--steps", "24", "--rounds", "1", "--grid", "4"], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = re.findall(r"^(fixed|grid|fresh)\s+(\d+)\s+([\d.]+) \[", proc.stdout, flags=re.M)
    sizes = {case: int(n) for case, n, _ in rows}
    assert list(sizes) == ["fixed", "grid", "fresh"] and sizes["fixed"] == 1, proc.stdout
    assert 2 <= sizes["grid"] <= 7 and sizes["fresh"] == 14, proc.stdout  # 7 multiples of 4 in [12, 36]
    assert all(float(ms) > 0 for _, _, ms in rows)
    bad = subprocess.run([sys.executable, "-m", "benchmarks.shapes", "--steps", "500"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert bad.returncode == 2 and "--steps=500" in bad.stdout


@pytest.mark.skipif(not __import__("benchmarks.contention").contention.cgroups_writable(),
                    reason="the elastic benchmark sets per-worker CPU quotas: needs root and a writable cgroup")
def test_elastic_benchmark_runs_a_join_and_a_kill_and_reports_both(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = tmp_path / "elastic"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.elastic", "--policies", "lbbsp", "--repeats", "1",
                           "--epochs", "4", "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    table = (out / "table.md").read_text()
    assert "join 2 -> 3" in table and "kill 3 -> 2" in table, table
    assert (out / "lbbsp" / "r0" / "timeline.png").stat().st_size > 1000
    bad = subprocess.run([sys.executable, "-m", "benchmarks.elastic", "--policies", "fastest"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert bad.returncode == 2 and "--policies='fastest' is not allowed" in bad.stdout


def test_recorder_fixed_cost_from_random_batches():
    from benchmarks.record import fixed_cost

    rng = np.random.default_rng(4)
    k = 20.0
    speed = np.repeat(rng.choice([1000.0, 400.0, 150.0], 40), 25)  # contention switching, independent of b
    batch = np.exp(rng.uniform(np.log(16), np.log(161), speed.size)).astype(int)
    time = (k + batch) / speed * np.exp(rng.normal(0, 0.05, speed.size))
    time[::97] *= 5  # stalls
    assert fixed_cost(batch, time) == pytest.approx(k, rel=0.2)
    assert fixed_cost(np.full(10, 64), np.full(10, 0.1)) == 0.0


def test_every_live_variant_parses_and_builds_its_policy():
    for label, (policy, *_) in VARIANTS.items():
        argv = ["--scenario", "static-4", "--out-dir", "x"] + worker_options(label)
        if policy == "oracle":
            argv += ["--curves", "curves.json"]
        args = parse_worker(argv)
        assert make_policy(args) == policy or isinstance(make_policy(args), LBBSPPolicy), label
    assert worker_options("lbbsp-narx@base") == worker_options("lbbsp-narx")
    assert make_policy(parse_worker(["--scenario", "x", "--policy", "lbbsp", "--out-dir", "x",
                                     "--min-gain", "0.05"])).min_gain == 0.05


@pytest.mark.parametrize("argv, message", [
    (["--policy", "lbbsp", "--min-gain", "2"], "min_gain=2.0 is not allowed"),
    (["--policy", "pid", "--min-gain", "0.1"], "--min-gain is an option of --policy lbbsp"),
])
def test_worker_options_refuse_bad_values(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_worker(["--scenario", "x", "--out-dir", "x"] + argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("module", ["simulate", "gpusim", "decision"])
def test_a_list_argument_that_is_not_integers_is_named(module, capsys):
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(f"benchmarks.{module}").main(["--workers", "4,x"])
    assert "'4,x' is not allowed: give comma-separated integers" in capsys.readouterr().err


def test_paired_ratios_pool_rounds_of_several_launches_and_size_the_rounds_a_difference_needs(tmp_path, capsys):
    from benchmarks.paired import describe, main, ratios

    def launch(name, times):  # {variant: [epoch time of round 0, 1, ...]}
        for variant, values in times.items():
            for r, value in enumerate(values):
                if value is not None:
                    os.makedirs(tmp_path / name / variant / f"r{r}")
                    (tmp_path / name / variant / f"r{r}" / "summary.json").write_text(json.dumps({"epoch_time": value}))
        return str(tmp_path / name)

    one = launch("one", {"a": [1.0, 2.2, 0.9], "a@base": [1.1, 2.0, None]})  # round 2 ran only one of them
    two = launch("two", {"a": [3.0, 0.5], "a@base": [3.0, 0.4]})
    x = ratios([one, two], "a", "a@base")
    np.testing.assert_allclose(x, [1.0 / 1.1, 1.1, 1.0, 1.25])
    figures = describe(x)
    assert figures["rounds"] == 4 and figures["faster"] == 1 and figures["median"] == pytest.approx(1.05)
    spread = np.std(np.log(x), ddof=1) * np.sqrt(np.pi / 2)
    assert figures["error"] == pytest.approx(spread / 2)
    assert figures["rounds_to_resolve"] == int(np.ceil((spread / 0.02) ** 2))
    # Ratios that scatter by 10% (log standard deviation) need about 40 rounds to resolve 2%, 4 times as many for 1%.
    scattered = np.exp(np.random.default_rng(0).normal(0, 0.1, 400))
    wide = describe(scattered)
    assert 30 <= wide["rounds_to_resolve"] <= 50
    assert describe(scattered, resolve=0.01)["rounds_to_resolve"] == pytest.approx(4 * wide["rounds_to_resolve"],
                                                                                  rel=0.02)
    assert main([one, two, "--variants", "a,a@base", "--json", str(tmp_path / "f.json")]) == 0
    assert "a / a@base over 4 rounds: median 1.050" in capsys.readouterr().out
    assert json.loads((tmp_path / "f.json").read_text())["faster"] == 1
    for argv, message in (([one, "--variants", "a"], "--variants='a' is not allowed"),
                          ([one, "--variants", "a,b"], "0 paired round"),
                          ([str(tmp_path / "none"), "--variants", "a,b"], "does not exist"),
                          ([one, "--variants", "a,a@base", "--resolve", "2"], "--resolve=2.0 is not allowed")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err


def test_simulator_puts_the_decision_period_to_work(capsys):
    from benchmarks.simulate import drive, main

    cluster = Cluster(4, 40, seed=0, profile="low-noise")
    bounds = Bounds.of(4, 256, multiple=cluster.multiple)
    runs = {ms: [b.copy() for b, _, _ in drive("lbbsp", "ema", np.full(20, 256), bounds, 40, cluster.compute_times,
                                              decision_seconds=ms / 1e3)] for ms in (0.0, 1e3)}
    moves = {ms: sum(bool(np.any(a != b)) for a, b in zip(r, r[1:])) for ms, r in runs.items()}
    # A decision that takes a second holds the split for MAX_PERIOD steps, but for the steps that surprise the policy.
    assert moves[0.0] > 4 * moves[1e3], moves
    assert main(["--workers", "4", "--steps", "30", "--policies", "lbbsp-ema", "--decision-ms", "5"]) == 0
    with pytest.raises(SystemExit):
        main(["--workers", "4", "--decision-ms", "-1"])
    assert "decision ms -1.0 (>= 0)" in capsys.readouterr().err


def test_alike_replays_identical_workers_noise_through_the_decision(tmp_path, capsys):
    from benchmarks.alike import fit_line, main, read_run

    rng = np.random.default_rng(0)
    fields = ["epoch", "step", "global_batch", "batch_size", "forecast", "compute", "decision"]

    def run(variant, r, splits):
        folder = tmp_path / "s" / variant / f"r{r}"
        os.makedirs(folder)
        noise = np.exp(rng.normal(0.0, 0.1, (len(splits), 2)))
        for rank in (0, 1):
            with open(folder / f"steps_rank{rank}.csv", "w", newline="") as f:
                out = csv.writer(f)
                out.writerow(fields)
                for s, split in enumerate(splits):
                    out.writerow([s // 16, s % 16, sum(split), split[rank], "nan",
                                  (0.005 + 0.00005 * split[rank]) * noise[s, rank], 0.002])

    for r in range(3):
        run("equal", r, [(128, 128)] * 48)
        run("lbbsp-narx", r, [(96, 160), (160, 96), (128, 128)] * 16)
    assert read_run(str(tmp_path / "s" / "equal" / "r0"))[2] == 16
    fixed, per_sample = fit_line([read_run(str(tmp_path / "s" / "lbbsp-narx" / f"r{r}")) for r in range(3)])
    assert fixed == pytest.approx(0.005, rel=0.2) and per_sample == pytest.approx(0.00005, rel=0.2)
    assert main([str(tmp_path / "s"), "--policies", "equal,lbbsp-last", "--json", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert "3 equal runs" in out and "2.00 ms per decision" in out
    assert next(line for line in out.splitlines() if line.startswith("equal ")).split()[1:4] == ["1.0000"] * 3
    figures = json.loads((tmp_path / "a.json").read_text())["policies"]["lbbsp-last"]
    assert len(figures["ratios"]) == 3 and all(r > 0.9 for r in figures["ratios"])
    for argv, message in (([str(tmp_path)], "none holds runs of the `equal` variant"),
                          ([str(tmp_path / "s"), "--line", "5,-1"], "--line '5,-1' is not allowed"),
                          ([str(tmp_path / "s"), "--policies", "oracle"], "policies ['oracle']")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err


def test_overhead_names_an_unknown_variant(capsys):
    from benchmarks import overhead
    with pytest.raises(SystemExit):
        overhead.main(["--variants", "lbbsp-narx,lbbsp-narx-later"])
    assert "['lbbsp-narx-later'] are not variants" in capsys.readouterr().err


def test_ablations_switch_off_what_they_name():
    from benchmarks.ablation import ABLATIONS
    from benchmarks.stepchange import POLICIES as STEP_POLICIES
    from lbbsp.policies import LBBSPPolicy

    bounds = Bounds.of(8, 1024, multiple=8)
    shipped, noprior = LBBSPPolicy(), ABLATIONS["abl-noprior"][1]()
    for policy in (shipped, noprior):
        policy.start(1024, bounds)
        policy.prepare(gpu=True)
    assert noprior.model.offset_prior == 0.0 and shipped.model.offset_prior > 0.0
    assert set(ABLATIONS) <= set(STEP_POLICIES)
