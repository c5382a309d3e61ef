"""Multi-process tests: real Horovod jobs started with horovodrun (2 and 3 ranks, Gloo; elastic)."""
import collections
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def horovodrun(num_proc, script, *args, timeout=600, expect_failure=False):
    """Run tests/mp/SCRIPT on `num_proc` local ranks; fail with the job's output if it fails (or, expecting
    a failure, if it succeeds)."""
    return launch(num_proc, [os.path.join(HERE, "mp", script), *map(str, args)], timeout, expect_failure)


def launch(num_proc, argv, timeout=600, expect_failure=False):
    """Run `python ARGV` on `num_proc` local ranks from the repository's root; its output."""
    launcher = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or shutil.which("horovodrun")
    assert launcher, "horovodrun not found: run the README's test command, which builds the environment"
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    cmd = [launcher, "-np", str(num_proc), "-H", f"localhost:{num_proc}", "--gloo", sys.executable, *argv]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    if expect_failure:
        assert proc.returncode != 0, f"{' '.join(cmd)} was meant to fail:\n{proc.stdout[-6000:]}"
    else:
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-6000:]}"
    return proc.stdout


@pytest.mark.parametrize("num_proc, shares, option", [(2, "3,13", None), (3, "1,2,5", None),
                                                    (2, "3,13", "mixed_float16"), (2, "3,13", "fp16"),
                                                    (3, "1,2,5", "per_tensor"), (2, "3,13", "legacy_sparse")])
def test_weights_equal_single_process_sgd(tmp_path, num_proc, shares, option):
    # Under "mixed_float16" Keras wraps the optimizer in a LossScaleOptimizer and the passes run in float16,
    # on each rank's part of the batch against the whole batch; "fp16" compresses the gradients in the
    # allreduce, not the exchanged rows: equal to 16-bit rounding. "per_tensor" reduces each gradient on its own;
    # "legacy_sparse" weights the loss through Keras' legacy optimizer and a sparse (embedding) gradient.
    out = tmp_path / "result.json"
    horovodrun(num_proc, "equivalence.py", out, shares, *([option] if option else []))
    r = json.loads(out.read_text())
    tolerance = 1e-5 if option in (None, "per_tensor", "legacy_sparse") else 2e-3
    assert r["size"] == num_proc
    assert len(r["batches"]) > 1, "batches were meant to be unequal"
    assert r["max_weight_diff"] < tolerance
    assert r["digests_ok"], "every rank's row arrives whole (a 16-bit digest would not)"
    assert (r["optimizer"] == "LossScaleOptimizerV3") == (option == "mixed_float16"), r["optimizer"]
    # Reported loss and metrics are the global sample-weighted values, not per-rank averages.
    np.testing.assert_allclose(r["lbbsp_loss"], r["ref_loss"], rtol=tolerance)
    np.testing.assert_allclose(r["lbbsp_mae"], r["ref_mae"], rtol=tolerance)
    np.testing.assert_allclose(r["lbbsp_val_loss"], r["ref_val_loss"], rtol=tolerance)
    np.testing.assert_allclose(r["lbbsp_val_mae"], r["ref_val_mae"], rtol=tolerance)
    assert {"lbbsp_efficiency", "lbbsp_idle_fraction", "lbbsp_batch", "lbbsp_overhead_ms"} <= set(r["lbbsp_keys"])


@pytest.mark.parametrize("num_proc, predictor, pipeline, multiple", [
    (1, "random", "function", 1), (2, "random", "function", 1), (3, "random", "function", 1),
    (3, "failing", "function", 1), (2, "random", "sample", 1), (3, "random", "sample", 4),
    (3, "random", "function", "auto"), (3, "random", "function", "held"),
])
def test_exactly_once_and_same_decisions_on_every_rank(tmp_path, num_proc, predictor, pipeline, multiple):
    out = tmp_path / "result.json"
    held = multiple == "held"  # decisions over their budget: the split decided from the first step holds
    multiple = 1 if held else multiple
    horovodrun(num_proc, "exactly_once.py", out, predictor, pipeline, multiple, "held" if held else "every")
    r = json.loads(out.read_text())
    ranks = r["ranks"]
    for epoch in range(3):
        seen = np.sort(np.concatenate([rank["epochs"][epoch] for rank in ranks]))
        assert np.array_equal(seen, np.arange(r["num_samples"])), f"epoch {epoch} did not read every sample once"
    assert all(rank["decisions"] == ranks[0]["decisions"] for rank in ranks), "ranks disagreed on batch sizes"
    assert all(rank["resynced"] == [] for rank in ranks), "the split digests disagreed"
    assert all(rank["final_loss"] == ranks[0]["final_loss"] for rank in ranks), "replicas diverged"
    # The step-time model is the same on every rank, bit for bit.
    assert all(rank["offsets"] == ranks[0]["offsets"] and rank["identified"] == ranks[0]["identified"] and
               rank["speeds"] == ranks[0]["speeds"] for rank in ranks)
    if multiple == "auto":
        assert r["grid"] == 1  # the default grid on CPU workers: any batch size
        multiple = 1
    if held:  # the same period on every rank (no resync above); the rows of steps 0 and 1 (run with the first
        # plans) report no decision time yet, so their decisions hold for one step: from step 4 the split holds
        later = {tuple(split) for split in ranks[0]["decisions"][4:] if sum(split) == r["global_batch"]}
        assert len(later) == 1 and later != {(8, 8, 8)}, ranks[0]["decisions"]
    elif num_proc > 1:
        assert len(ranks[0]["batch_sizes"]) >= 4 - (multiple > 1), "the batch size was meant to change"
    full = [split for split in ranks[0]["decisions"] if sum(split) == r["global_batch"]]
    assert full and all(b % multiple == 0 for split in full for b in split), "a split left the batch grid"
    # One trace for all batch sizes (TensorFlow counts the variable-creating first call twice).
    assert all(rank["tracing_count"] <= 2 for rank in ranks)
    if predictor == "failing":
        assert ranks[-1]["predictor_failures"] > 0


@pytest.mark.parametrize("gpu", [False, True])
def test_slowed_worker_gets_smaller_batch(tmp_path, gpu):
    """A worker slowed for real gets the smaller batch; the epoch times are printed, not asserted.

    Eight-step epochs on a shared machine swing by 30% between runs, so whether balancing pays is
    measured by the benchmarks (``benchmarks.compare --scenario slowed-2``, interleaved repeats).
    With `gpu`, the ranks claim GPUs: the decision path runs in its GPU mode (set-up costs, floors, pooled
    fixed costs and their prior, running mean speeds) and, every grid shape set up before training, moves for free.
    """
    out = tmp_path / "result.json"
    horovodrun(2, "slowed.py", out, "lbbsp", *(["gpu"] if gpu else []))
    r = json.loads(out.read_text())
    for rank in r["ranks"]:
        mode = rank["lbbsp"]["gpu_mode"]
        assert mode["gpu"] == gpu and mode["mean_rate"] == (0.2 if gpu else 1.0) and mode["resyncs"] == 0, mode
        assert mode["offset_prior"] == (0.2 * 512 if gpu else 0.0), mode  # k before its fit: 0.2 of the equal batch
        assert not gpu or mode["set_up_measured"] == 0, "every shape it ran was set up before training"
    fast, slow = r["ranks"]
    print(f"slowdown: {r['slowdown']}; epoch time equal {fast['equal']['epoch_time']:.3f}s, "
          f"lbbsp {fast['lbbsp']['epoch_time']:.3f}s; slow worker's batch {slow['lbbsp']['batch']:.1f} of 1024")
    # The default batch grid (on GPUs 8 for 1024 samples on 2 workers; on CPUs 1) holds while the split moves.
    grid = 8 if gpu else 1
    assert slow["lbbsp"]["grid"] == grid and len(slow["lbbsp"]["sizes"]) > 1
    assert all(b % grid == 0 for rank in (fast, slow) for b in rank["lbbsp"]["sizes"]), slow["lbbsp"]["sizes"]
    trace = f"(epoch, step, batch, compute ms) of each rank: {fast['lbbsp']['trace']} {slow['lbbsp']['trace']}"
    assert slow["lbbsp"]["batch"] < 0.8 * slow["equal"]["batch"], trace
    assert fast["lbbsp"]["batch"] > fast["equal"]["batch"], trace


def _steps_where_the_ranks_split_differently(ranks):
    steps = len(ranks[0]["splits"])
    assert all(len(r["splits"]) == steps for r in ranks)
    return [t for t in range(steps) if any(r["splits"][t] != ranks[0]["splits"][t] for r in ranks)]


@pytest.mark.parametrize("num_proc", [2, 3])
def test_ranks_that_decide_differently_resync_at_the_step_they_part(tmp_path, num_proc):
    out = tmp_path / "result.json"
    horovodrun(num_proc, "diverge.py", out, "inject")
    ranks = json.loads(out.read_text())["ranks"]
    differ = _steps_where_the_ranks_split_differently(ranks)
    # Two injected decisions, each found at the step that ran it and mended from the next step on.
    assert len(differ) == 2, differ
    assert all(r["resynced"] == differ for r in ranks), [r["resynced"] for r in ranks]
    assert all(r["resyncs"][-1] == 2 for r in ranks)
    assert not any(r["build_warning"] for r in ranks)


def test_ranks_whose_numpy_rounds_differently_are_warned_and_kept_together(tmp_path):
    out = tmp_path / "result.json"
    horovodrun(2, "diverge.py", out, "cpu")
    ranks = json.loads(out.read_text())["ranks"]
    differ = _steps_where_the_ranks_split_differently(ranks)
    print(f"steps with different splits: {differ}; resyncs {ranks[0]['resynced']}")
    # Where this machine has AVX-512, rank 1's numpy runs other kernels: the start-up check says so, and every
    # step the ranks split differently is one they then resynchronise at (none, on a machine without AVX-512).
    assert ranks[0]["build_warning"] == ranks[1]["build_warning"]
    assert all(r["resynced"] == differ for r in ranks), [r["resynced"] for r in ranks]
    if not ranks[0]["build_warning"]:
        assert differ == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, where every write fails")
def test_parts_of_lbbsp_that_fail_mid_training_leave_training_going(tmp_path):
    # The step log on a full disk, a state that cannot be pickled, a policy whose split miscounts: warnings,
    # every epoch trained, every rank on the same split.
    horovodrun(2, "plugin_failures.py", tmp_path, "/dev/full")
    for rank in range(2):
        r = json.loads((tmp_path / f"failures_{rank}.json").read_text())
        assert r["epochs"] == 3 and r["rows"] == 3 * 128 and r["resyncs"] == 0, r  # 2048 samples, 16 a step
        assert sum("writing the step log /dev/full failed" in w for w in r["warnings"]) == 1, r["warnings"]
        assert sum("saving the state" in w for w in r["warnings"]) == 3, r["warnings"]
        assert sum("policy failed (ValueError('it returned the split" in w for w in r["warnings"]) == 1, r["warnings"]
        assert len(r["batches"]) > 1, r  # the policy still moved the split where its splits were whole
        assert not [f for f in r["state_files"] if f.startswith("state_")], r["state_files"]  # nor a .tmp left


@pytest.mark.parametrize("num_proc", [2, 3])
def test_a_rank_that_raises_mid_step_ends_the_job_with_its_error(num_proc):
    import time

    start = time.monotonic()
    out = horovodrun(num_proc, "fault.py", timeout=300, expect_failure=True)
    assert f"injected failure on rank {num_proc - 1}" in out, out[-3000:]
    assert time.monotonic() - start < 300


@pytest.mark.parametrize("num_proc", [2, 3])
def test_resume_mid_epoch_keeps_exactly_once_and_the_balanced_split(tmp_path, num_proc):
    horovodrun(num_proc, "resume.py", tmp_path, "crash")
    horovodrun(num_proc, "resume.py", tmp_path, "resume")
    crash = [json.loads((tmp_path / f"crash_{r}.json").read_text()) for r in range(num_proc)]
    resume = [json.loads((tmp_path / f"resume_{r}.json").read_text()) for r in range(num_proc)]
    assert all(c["outcome"].startswith("simulated failure") for c in crash)
    assert all(r["outcome"] == "finished" and r["resumed"] for r in resume)
    # Keras resumes after the last backup (step 5 of epoch 1); steps 6 and 7 are replayed.
    assert resume[0]["sizes"][0][:2] == [1, 6]
    # Epoch 1: steps 0-5 of the first run and 6-11 of the second read every sample exactly once.
    seen = [i for c in crash for (e, s, idx) in c["read"] if e == 1 and s <= 5 for i in idx]
    seen += [i for r in resume for (e, s, idx) in r["read"] if e == 1 for i in idx]
    assert sorted(seen) == list(range(96))
    later = sorted(i for r in resume for (e, s, idx) in r["read"] if e == 2 for i in idx)
    assert later == list(range(96))
    # The first resumed step already uses the balanced 1 : 2 (: 3) split saved before the crash.
    before = [b for (e, s, b) in crash[0]["sizes"] if (e, s) == (1, 6)][0]
    first = resume[0]["sizes"][0][2]
    assert first == before and max(b / (10.0 * (r + 1)) for r, b in enumerate(first)) == {2: 0.3, 3: 0.15}[num_proc]
    assert all(r["weights"] == resume[0]["weights"] for r in resume), "replicas diverged after the resume"


@pytest.mark.parametrize("num_proc", [2, 3])
def test_resume_from_a_model_checkpoint_with_initial_epoch(tmp_path, num_proc):
    horovodrun(num_proc, "resume.py", tmp_path, "crash", "epochs")
    horovodrun(num_proc, "resume.py", tmp_path, "resume", "epochs")
    crash = json.loads((tmp_path / "crash_0.json").read_text())
    resume = [json.loads((tmp_path / f"resume_{r}.json").read_text()) for r in range(num_proc)]
    assert crash["outcome"].startswith("simulated failure") and all(r["resumed"] for r in resume)
    assert resume[0]["sizes"][0][:2] == [1, 0], "fit(initial_epoch=1) starts at the first step of epoch 1"
    # Balanced from the first step: the split the crashed run used there, a min-max split of 1 : 2 (: 3) (with
    # two workers [3, 5] and [2, 6] tie at 0.3 s).
    first = resume[0]["sizes"][0][2]
    assert first == [b for (e, s, b) in crash["sizes"] if (e, s) == (1, 0)][0]
    assert max(b / (10.0 * (r + 1)) for r, b in enumerate(first)) == {2: 0.3, 3: 0.15}[num_proc], first
    for epoch in (1, 2):
        seen = sorted(i for r in resume for (e, s, idx) in r["read"] if e == epoch for i in idx)
        assert seen == list(range(96))


def elastic_horovodrun(tmp_path, hosts, *options, mode="churn", timeout=600):
    """horovodrun in elastic mode on this machine: "localhost" and "127.0.0.1" are two hosts (Horovod's own
    elastic tests do the same), listed by a discovery script that prints tmp_path/hosts."""
    launcher = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or shutil.which("horovodrun")
    (tmp_path / "hosts").write_text(hosts)
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {tmp_path / 'hosts'}\n")
    discover.chmod(0o755)
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    cmd = [launcher, *options, "--host-discovery-script", str(discover), "--gloo", "--network-interfaces", "lo",
           sys.executable, os.path.join(HERE, "mp", "elastic.py"), str(tmp_path), mode]
    return subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def committed_records(tmp_path, epochs):
    """Every committed step's record, after checking that each epoch trained on every sample exactly once."""
    records = [json.loads(line) for path in sorted(tmp_path.glob("committed_*.jsonl"))
               for line in path.read_text().splitlines()]
    committed = collections.defaultdict(list)
    for record in records:
        committed[record["epoch"]].extend(record["indices"])
    assert sorted(committed) == list(range(epochs))
    for epoch, indices in committed.items():
        assert sorted(indices) == list(range(192)), f"epoch {epoch}: a sample was lost or trained twice"
    return records


def test_elastic_join_leave_and_sigkill_keep_every_sample_once_and_the_replicas_equal(tmp_path):
    proc = elastic_horovodrun(tmp_path, "localhost:2\n", "-np", "2", "--min-np", "2", "--max-np", "3")
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert (tmp_path / "phase").read_text() == "3", "the run did not go through every membership change"
    records = committed_records(tmp_path, epochs=5)
    assert {r["size"] for r in records} == {2, 3}
    # The SIGKILLed worker (the second to join 127.0.0.1) trained in the epoch it died in, and the two
    # that stay finished that epoch: it died mid-epoch.
    finals = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("final_*.json"))]
    assert [f["size"] for f in finals] == [2, 2] and {f["host"] for f in finals} == {"localhost"}
    assert finals[0]["weights"] == finals[1]["weights"], "replicas differ after the resets"
    assert all(np.isfinite(f["weights"]).all() for f in finals)


def test_elastic_min_np_above_the_available_hosts_fails_with_a_clear_error(tmp_path):
    proc = elastic_horovodrun(tmp_path, "localhost:2\n", "-np", "3", "--min-np", "3", "--max-np", "3",
                              "--elastic-timeout", "5", timeout=120)
    assert proc.returncode != 0 and "enough resources to run at least 3 Horovod processes" in proc.stdout


def test_elastic_scaled_global_batch_ramps_the_learning_rate(tmp_path):
    proc = elastic_horovodrun(tmp_path, "localhost:2\n", "-np", "2", "--min-np", "2", "--max-np", "3", mode="scale")
    assert proc.returncode == 0, proc.stdout[-6000:]
    records = committed_records(tmp_path, epochs=3)
    rank0 = [r for r in records if r["rank"] == 0]
    batches = {size: collections.Counter(r["global"] for r in rank0 if r["size"] == size) for size in (2, 3)}
    # 8 samples per worker: 16 with 2 workers, 24 with 3 (a resumed epoch's last step may hold fewer).
    assert batches[2].most_common(1)[0][0] == 16 and batches[3].most_common(1)[0][0] == 24, batches
    # Rank 0's learning rate: 0.05 with 2 workers (global batch 16), then 0.05 -> 0.075 (batch 24) in 4 steps.
    lrs = [round(r["lr"], 6) for r in rank0]
    first3 = next(i for i, r in enumerate(rank0) if r["size"] == 3)
    assert set(lrs[:first3]) == {0.05}
    assert lrs[first3:first3 + 5] == [0.05, 0.05625, 0.0625, 0.06875, 0.075], lrs
    assert set(lrs[first3 + 5:]) == {0.075}


def test_the_example_runs_plain_horovod_and_lbbsp_side_by_side():
    # examples/train.py as a user runs it, in a short setting: both jobs train, rank 1 slowed.
    out = launch(2, [os.path.join(ROOT, "examples", "train.py"), "--slow-rank", "1", "--epochs", "2",
                     "--samples", "4096"])
    assert "rank 1 is slowed by" in out
    rows = {name: line for line in out.splitlines() for name in ("plain Horovod", "lbbsp ")
            if name in line and "s/epoch" in line}
    assert set(rows) == {"plain Horovod", "lbbsp "}, out[-3000:]
    accuracy = {name: float(line.rsplit("final accuracy", 1)[1]) for name, line in rows.items()}
    assert all(0.2 < a <= 1.0 for a in accuracy.values()), accuracy  # both learn (10 classes: chance is 0.1)


def test_the_overhead_benchmark_reports_every_variant():
    from benchmarks.overhead import VARIANTS

    # More steps than the 32 global batches of data the lbbsp variants once read: each variant is timed over all.
    out = launch(2, ["-m", "benchmarks.overhead", "--rounds", "1", "--steps", "40", "--decision-ms", "2"])
    assert "2 ms of CPU added to each decision" in out and "1 rounds x 29 steady steps per variant" in out, \
        out[-3000:]
    rows = {line.split()[0].split(":")[-1]: line.split()[1:] for line in out.splitlines()
            if line.split()[1:2] and line.split()[0].split(":")[-1] in VARIANTS}
    assert set(rows) == set(VARIANTS), out[-3000:]
    cpu = {name: float(values[5]) for name, values in rows.items()}  # ms per step, every thread of the process
    assert all(0 < ms < 1000 for ms in cpu.values()), cpu
    # A decision at every step carries the added CPU; equal batches' decisions are not lbbsp's policy's.
    background = {name: float(values[7]) for name, values in rows.items() if values[7] != "-"}
    assert background["lbbsp-narx-every"] >= 2.0 > background["equal"], background
