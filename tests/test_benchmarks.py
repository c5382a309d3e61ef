"""Benchmark machinery: scenarios, figures, the simulator at 1024 workers, and a real short comparison."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.analysis import summarize
from benchmarks.scenario import Scenario, list_scenarios
from benchmarks.simulate import Cluster, simulate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_shipped_scenarios_load():
    names = list_scenarios()
    assert {"static-4", "dynamic-2", "homogeneous-2", "accuracy-2", "slowed-2"} <= set(names)
    for name in names:
        s = Scenario.load(name)
        assert len(s.speeds) == s.workers and s.ideal_speedup() >= 1.0
    s = Scenario.load("static-4")
    assert s.ideal_speedup() == pytest.approx(2.75 / 1.0)
    d = Scenario.load("dynamic-2")
    assert d.true_speed(1, 1.0) == pytest.approx(0.33 * 0.9) and d.state(0, 3.0) == (1.0, True)
    assert d.true_speed(0, 3.0) == pytest.approx(0.5), "a hog leaves half the core"
    assert d.state(1, 6.0 + 1.0) == d.state(1, 1.0) and d.state(0, 6.2) == (1.0, False), "the pattern repeats"


@pytest.mark.parametrize("patch, message", [
    ({"workers": 0}, "workers=0"),
    ({"speeds": [1, 2]}, "speeds=[1, 2]"),
    ({"workload": "resnet"}, "workload='resnet'"),
    ({"events": [{"at": 1, "worker": 9, "speed": 0.5}]}, "event"),
    ({"epochs": 1}, "epochs=1"),
    ({"period": 0.5, "events": [{"at": 1, "worker": 0, "speed": 0.5}]}, "period=0.5"),
])
def test_bad_scenarios_name_the_value(patch, message):
    data = {"name": "x", "workers": 2, "workload": "mlp", "global_batch": 64, "epochs": 3, "scale": 0.5,
            "speeds": [1, 0.5]}
    data.update(patch)
    with pytest.raises(ValueError, match=re.escape(message)):
        Scenario(data)
    with pytest.raises(ValueError, match="scenario='nope'"):
        Scenario.load("nope")


def test_summary_figures_from_histories():
    def rows(batches, computes, waits):
        return [{"epoch": 1, "step": i, "batch": b, "compute": c, "wait": w, "step_time": c + w, "overhead": 1e-4}
                for i, (b, c, w) in enumerate(zip(batches, computes, waits))]

    # Worker 1 is twice as slow per sample and gets equal batches: eta = T*/T = (2/3) / 1.
    histories = [rows([10, 10], [0.5, 0.5], [0.5, 0.5]), rows([10, 10], [1.0, 1.0], [0.0, 0.0])]
    epochs = [{"time": 9.0, "accuracy": 0.5}, {"time": 2.0, "accuracy": 0.8}, {"time": 2.0, "accuracy": 0.95}]
    s = summarize(histories, epochs, 20, 100, 0.9)
    assert s["epoch_time"] == 2.0 and s["throughput"] == 50.0
    assert s["efficiency"] == pytest.approx(2 / 3) and s["straggler"] == pytest.approx(0.5 / 0.75)
    assert s["idle_fraction"] == pytest.approx(1.0 / 4.0) and s["time_to_accuracy"] == 13.0
    assert s["mean_batch"] == [10.0, 10.0] and s["final_accuracy"] == 0.95


def test_simulator_at_1024_workers_uses_the_real_policy_code():
    cluster = Cluster(1024, 40, seed=1)
    equal = simulate(cluster, "equal", None, 64 * 1024)
    oracle = simulate(cluster, "oracle", None, 64 * 1024)
    lbbsp = simulate(cluster, "lbbsp", "ema", 64 * 1024)
    assert oracle["eta"][5:].mean() > 0.95
    assert lbbsp["step_time"][10:].mean() < equal["step_time"][10:].mean()
    assert np.median(oracle["decide"]) < 1e-3, "an allocation for 1024 workers must cost under 1 ms"


def test_compare_runs_policies_under_horovodrun(tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text("name: tiny\nworkers: 2\nworkload: mlp\nglobal_batch: 256\nepochs: 2\nhidden: 64\n"
                        "scale: 1.0\nspeeds: [1, 0.5]\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.compare", "--scenario", str(scenario), "--variants",
                           "horovod,equal,lbbsp-narx,oracle", "--out", str(tmp_path / "out"), "--emulate"],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "| lbbsp-narx |" in proc.stdout and "emulated" in proc.stdout
    results = json.loads((tmp_path / "out" / "tiny" / "results.json").read_text())
    assert set(results) == {"horovod", "equal", "lbbsp-narx", "oracle"}
    assert results["lbbsp-narx"]["heterogeneity"].startswith("emulated")
    assert results["oracle"]["mean_batch"][1] < results["oracle"]["mean_batch"][0]
    assert (tmp_path / "out" / "tiny" / "iteration_and_idle.png").stat().st_size > 1000
    assert (tmp_path / "out" / "tiny" / "lbbsp-narx" / "steps_rank1.csv").exists()
