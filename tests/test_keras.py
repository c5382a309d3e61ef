"""Keras tests in one process (Horovod size 1): the callback, the optimizer wrapper and the feed on a tiny model."""
import csv
import logging
import time
from unittest import mock

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
hvd = pytest.importorskip("horovod.tensorflow.keras")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
hvd.init()

import lbbsp.keras as lb  # noqa: E402
from lbbsp.policies import Policy  # noqa: E402
from predictor.base import SpeedPredictor  # noqa: E402

X = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
Y = X.sum(axis=1, keepdims=True)


def tiny(optimizer=None):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=optimizer or lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse",
                  metrics=["mae"])
    return model


def fit(model, feed, balancer, epochs=2, **kwargs):
    return model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=epochs, verbose=0,
                     callbacks=[balancer], **kwargs)


def test_logs_history_and_csv(tmp_path):
    feed = lb.BalancedFeed(X, Y, global_batch=16)
    seen = []

    class Peek(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(dict(logs))

    balancer = lb.LoadBalancer(feed, predictor="ema", csv_path=str(tmp_path / "steps_{rank}.csv"))
    model = tiny()
    hist = model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=2, verbose=0,
                     callbacks=[balancer, Peek()])
    assert {"lbbsp_batch", "lbbsp_speed", "lbbsp_forecast", "lbbsp_compute_ms", "lbbsp_wait_ms"} <= set(seen[-1])
    assert [s["lbbsp_batch"] for s in seen[:4]] == [16, 16, 16, 2]
    assert len(balancer.history) == 8 and balancer.history[-1]["batch_size"] == 2
    for key in ("lbbsp_batch", "lbbsp_efficiency", "lbbsp_idle_fraction", "lbbsp_overhead_ms", "lbbsp_overhead_cpu_ms",
                "loss", "mae"):
        assert len(hist.history[key]) == 2
    assert "lbbsp_speed" not in hist.history, "per-step values stay out of the epoch logs"
    assert hist.history["lbbsp_batch"][0] == (16 * 3 + 2) / 4
    rows = list(csv.DictReader(open(tmp_path / "steps_0.csv")))
    assert len(rows) == 8 and rows[0]["rank"] == "0" and float(rows[-1]["compute"]) > 0
    assert 0 < float(rows[-1]["overhead_cpu"]) <= float(rows[-1]["overhead"]) + 1e-4
    assert "proc_cpu" in rows[0], "telemetry columns go with the CSV"


def test_step_timings_ignore_a_wall_clock_that_jumps(monkeypatch):
    # The wall clock set back an hour and forth again (NTP) while training: a step's times come from the monotonic
    # clock, so none is negative or an hour long.
    import time
    real, calls = time.time, [0]

    def jumping():
        calls[0] += 1
        return real() + (-3600.0 if calls[0] % 3 else 3600.0)

    feed = lb.BalancedFeed(X, Y, global_batch=16)
    balancer = lb.LoadBalancer(feed, predictor="ema")
    monkeypatch.setattr(time, "time", jumping)
    fit(tiny(), feed, balancer, epochs=2)
    monkeypatch.setattr(time, "time", real)
    for row in balancer.history:
        assert all(0 <= row[key] < 60 for key in ("compute", "wait", "step_time")), row


def test_train_function_traced_once_for_all_batch_sizes():
    # Schedule [16, 16, 16, 2]: two batch sizes; the count equals that of a run with one size.
    feed = lb.BalancedFeed(X, Y, global_batch=16)
    model_var = tiny()
    fit(model_var, feed, lb.LoadBalancer(feed), epochs=3)
    feed_fixed = lb.BalancedFeed(X[:48], Y[:48], global_batch=16)
    model_fixed = tiny()
    fit(model_fixed, feed_fixed, lb.LoadBalancer(feed_fixed), epochs=3)
    assert (model_var.train_function.experimental_get_tracing_count()
            == model_fixed.train_function.experimental_get_tracing_count() <= 2)


def test_legacy_optimizer_and_saved_model_loads_without_lbbsp(tmp_path):
    model = tiny(lb.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.01, momentum=0.5)))
    feed = lb.BalancedFeed(X, Y, global_batch=10)
    before = model.get_weights()
    fit(model, feed, lb.LoadBalancer(feed, predictor="last"))
    assert any(np.abs(a - b).max() > 0 for a, b in zip(before, model.get_weights()))
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = tf.keras.models.load_model(path)
    np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0), rtol=1e-6)
    assert type(loaded.optimizer).__name__ == "SGD"


def test_wrapped_optimizer_is_required():
    feed = lb.BalancedFeed(X, Y, global_batch=16)
    model = tiny(tf.keras.optimizers.SGD(0.01))
    with pytest.raises(ValueError, match="model.optimizer=.*lbbsp.keras.DistributedOptimizer"):
        fit(model, feed, lb.LoadBalancer(feed))


def test_steps_per_epoch_must_match_the_feed():
    feed = lb.BalancedFeed(X, Y, global_batch=16)
    with pytest.raises(ValueError, match="steps_per_epoch=3 is not allowed"):
        tiny().fit(feed.dataset(), steps_per_epoch=3, epochs=1, verbose=0, callbacks=[lb.LoadBalancer(feed)])
    # Without it the endless dataset never ends an epoch: refused before the first step, not at the epoch's end.
    with pytest.raises(ValueError, match=rf"steps_per_epoch=None is not allowed: .*\({feed.steps_per_epoch}\)"):
        tiny().fit(feed.dataset(), epochs=1, verbose=0, callbacks=[lb.LoadBalancer(feed)])


def test_the_balanced_optimizer_is_found_inside_or_around_a_loss_scale_optimizer():
    from lbbsp.keras.optimizer import balance_state

    scaled = tf.keras.mixed_precision.LossScaleOptimizer
    inside = scaled(lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)))  # what compile does under mixed_float16
    around = lb.DistributedOptimizer(scaled(tf.keras.optimizers.SGD(0.01)))
    assert balance_state(inside) is not None and balance_state(around) is not None
    assert balance_state(scaled(tf.keras.optimizers.SGD(0.01))) is None
    with pytest.raises(ValueError, match="already wrapped"):
        lb.DistributedOptimizer(inside)


def test_steps_per_execution_must_be_one():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(3,))])
    model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse",
                  steps_per_execution=2)
    feed = lb.BalancedFeed(X, Y, global_batch=16)
    with pytest.raises(ValueError, match="steps_per_execution=2"):
        fit(model, feed, lb.LoadBalancer(feed))


def test_jit_compile_is_refused_with_what_to_do_instead():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(3,))])
    model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse", jit_compile=True)
    feed = lb.BalancedFeed(X, Y, global_batch=16)
    with pytest.raises(ValueError, match="jit_compile=True is not allowed.*tf_xla_auto_jit=2"):
        fit(model, feed, lb.LoadBalancer(feed))


@pytest.mark.parametrize("kwargs, message", [
    ({"keep_steps": -1}, "keep_steps=-1"),
    ({"policy": "fastest"}, "policy='fastest'"),
    ({"predictor": "oracle9"}, "predictor='oracle9'"),
    ({"warmup_steps": -1}, "warmup_steps=-1"),
    ({"csv_path": 3}, "csv_path=3"),
    ({"state_every": 3}, "state_every=3 is not allowed without state_path"),
    ({"state_path": "state_{epoch}.pkl"}, r"state_path='state_\{epoch\}.pkl' is not allowed: the only field"),
    ({"forecast_budget": -1}, "forecast_budget=-1"),
])
def test_bad_callback_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        lb.LoadBalancer(lb.BalancedFeed(X, Y, global_batch=16), **kwargs)
    with pytest.raises(ValueError, match="feed="):
        lb.LoadBalancer(object())


@pytest.mark.parametrize("kwargs, message", [
    ({"csv_path": "/nonexistent-lbbsp/steps_{rank}.csv"}, "csv_path='/nonexistent-lbbsp/steps_0.csv' is not allowed"),
    ({"state_path": "/nonexistent-lbbsp/state_{rank}.pkl"}, "the folder '/nonexistent-lbbsp' does not exist"),
])
def test_paths_that_cannot_be_written_fail_before_the_first_step(kwargs, message):
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(3,))])
    model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
    feed = lb.BalancedFeed(X, Y, global_batch=16)
    stepped = []
    record = tf.keras.callbacks.LambdaCallback(on_train_batch_begin=lambda step, logs: stepped.append(step))
    with pytest.raises(ValueError, match=message):
        model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=1, verbose=0,
                  callbacks=[lb.LoadBalancer(feed, **kwargs), record])
    assert not stepped


def test_bad_optimizer_arguments():
    with pytest.raises(ValueError, match="optimizer='sgd'"):
        lb.DistributedOptimizer("sgd")
    wrapped = lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01))
    with pytest.raises(ValueError, match="already wrapped"):
        lb.DistributedOptimizer(wrapped)


@pytest.mark.parametrize("grouped", [False, True])
def test_the_stats_rows_ride_in_a_gradient_allreduce(grouped, monkeypatch):
    # Grouped (the default), every gradient goes with the rows; per tensor the rows ride with the smallest float32
    # gradient and every other gradient goes on its own as soon as it exists. Either way the sums are the gradients.
    from lbbsp.keras import optimizer as module
    from lbbsp.keras.optimizer import _reduce
    optimizer = lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), grouped=grouped)
    monkeypatch.setattr(module.hvd, "size", lambda: 2)  # traced as for two workers; the sums run over this one
    shapes = [(3, 4), (4,), (4, 1), (1,)]

    @tf.function
    def reduce():
        return _reduce(optimizer, [tf.fill(shape, float(i + 1)) for i, shape in enumerate(shapes)])

    ops = [op for op in reduce.get_concrete_function().graph.get_operations() if op.type.startswith("Horovod")]
    grouped_ops = [op for op in ops if op.type == "HorovodGroupedAllreduce"]
    assert len(grouped_ops) == 1
    riders = [tuple(t.shape.as_list()) for t in grouped_ops[0].inputs]
    assert riders[0] == (None, 4), "the rows (N x fields) come first"
    assert riders[1:] == (shapes if grouped else [(1,)])
    assert sum(op.type == "HorovodAllreduce" for op in ops) == (0 if grouped else len(shapes) - 1)
    for i, (shape, value) in enumerate(zip(shapes, reduce())):
        np.testing.assert_allclose(value.numpy(), np.full(shape, i + 1.0))


@pytest.mark.parametrize("elastic", [False, True])
def test_one_worker_runs_no_collective(elastic, monkeypatch):
    # A sum over one worker is its own gradient: no Horovod collective is traced, or in an elastic job (whose size
    # may change under a traced graph) one is traced behind a test of the size and skipped. The update is SGD's.
    from lbbsp.keras.optimizer import _reduce
    monkeypatch.setenv("HOROVOD_ELASTIC", "1" if elastic else "0")
    optimizer = lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01))

    @tf.function
    def reduce():
        return _reduce(optimizer, [tf.fill((3, 4), 2.0), tf.fill((4,), 3.0)])

    ops = {op.type for op in reduce.get_concrete_function().graph.get_operations()}
    assert not any("Allreduce" in kind for kind in ops)
    assert bool(ops & {"If", "StatelessIf"}) == elastic
    np.testing.assert_allclose(reduce()[0].numpy(), np.full((3, 4), 2.0))
    model, plain = tiny(lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))), tiny(tf.keras.optimizers.SGD(0.1))
    model.train_on_batch(X[:8], Y[:8]), plain.train_on_batch(X[:8], Y[:8])
    for mine, theirs in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


def test_failing_predictor_falls_back_with_one_warning(caplog):
    class Broken(SpeedPredictor):
        name = "broken"

        def _forecast(self):
            raise ZeroDivisionError("boom")

    feed = lb.BalancedFeed(X, Y, global_batch=16)
    balancer = lb.LoadBalancer(feed, predictor=Broken(), warmup_steps=0, forecast_budget=None)
    with caplog.at_level(logging.WARNING, logger="lbbsp"):
        hist = fit(tiny(), feed, balancer, epochs=3)
    assert len(hist.history["loss"]) == 3
    warnings = [r for r in caplog.records if "boom" in r.getMessage()]
    assert len(warnings) == 1
    # Every step forecasts but the first at each batch size (its set-up is no speed measurement).
    assert balancer.forecaster.failures == balancer.forecaster.model_steps > 0
    assert all(np.isfinite(r["forecast"]) for r in balancer.history[2:]), "fell back to the measured speed"


def test_a_slow_forecast_counts_in_the_next_steps_compute_time():
    # The forecast runs after the compute clock stops but delays this worker's entry into the allreduce:
    # the next step's exchanged compute time carries it, so the balancer sees what the worker costs.
    class Slow(SpeedPredictor):
        name = "slow"

        def _forecast(self):
            time.sleep(0.03)
            return self.history.last_valid()

    feed = lb.BalancedFeed(X, Y, global_batch=16)
    balancer = lb.LoadBalancer(feed, predictor=Slow(), warmup_steps=0, forecast_budget=None)
    fit(tiny(), feed, balancer, epochs=2)
    compute = np.array([r["compute"] for r in balancer.history])
    wait = np.array([r["wait"] for r in balancer.history])
    # The first two steps trace the train function; a step after one at a new batch size forecast nothing.
    assert np.median(compute[2:]) >= 0.03, compute
    assert np.nanmax(wait) < 0.03, "the forecast is not blocked time in the allreduce"


def test_a_forecast_over_budget_gives_way_to_the_last_speed_in_a_real_fit(caplog):
    # A 30 ms forecast on millisecond steps is far over a 1% budget: after five timings the worker
    # forecasts its last speed, and re-times the predictor every 16 steps. Without a budget it always runs.
    class Slow(SpeedPredictor):
        name = "slow"

        def _forecast(self):
            time.sleep(0.03)
            return 1.5 * self.history.last_valid()

    feed = lb.BalancedFeed(X, Y, global_batch=16)
    shares = {}
    for budget in (0.01, None):
        balancer = lb.LoadBalancer(feed, predictor=Slow(), warmup_steps=0, forecast_budget=budget)
        with caplog.at_level(logging.INFO, logger="lbbsp"):
            hist = fit(tiny(), feed, balancer, epochs=10)
        shares[budget] = hist.history["lbbsp_model_share"]
        rows = balancer.history  # the first step at each batch size is no speed measurement: no forecast from it
        rerun = [i for i, r in enumerate(rows) if r["batch_size"] in {h["batch_size"] for h in rows[:i]}]
        speeds = np.array([rows[i]["speed"] for i in rerun])
        forecasts = np.array([rows[i]["forecast"] for i in rerun])
    assert shares[None] == [1.0] * 10
    assert shares[0.01][0] == 1.0 and sum(shares[0.01][2:]) / 8 <= 0.1, shares[0.01]
    assert "forecasting the last measured speed" in caplog.text
    assert np.allclose(forecasts, 1.5 * speeds), "without a budget every forecast is the predictor's"


def test_telemetry_is_read_only_for_the_steps_a_predictor_over_budget_reads():
    # Budget 0: after five timings the NARX runs every 32nd step; the machine readings of the 8 steps
    # its window holds are read, the others not (unless a CSV asks for them).
    feed = lb.BalancedFeed(X, Y, global_batch=16)
    balancer = lb.LoadBalancer(feed, predictor="narx", warmup_steps=0, forecast_budget=0.0)
    fit(tiny(), feed, balancer, epochs=20)
    read = ["proc_cpu" in row for row in balancer.history]
    assert len(read) == 80 and all(read[:6]), read
    assert 8 <= sum(read[6:]) <= 30, read  # two re-timings' windows of 8 (plus the step that switches)
    csv_balancer = lb.LoadBalancer(feed, predictor="narx", warmup_steps=0, forecast_budget=0.0,
                                   csv_path="/dev/null")
    fit(tiny(), feed, csv_balancer, epochs=5)
    assert all("proc_cpu" in row for row in csv_balancer.history)


def test_a_custom_policy_plugs_in():
    class Halves(Policy):
        name = "halves"

        def after_step(self, stats, next_global_batch):
            assert stats.compute.shape == (1,) and np.isfinite(stats.compute).all()
            return super().after_step(stats, next_global_batch)

    feed = lb.BalancedFeed(X, Y, global_batch=16)
    fit(tiny(), feed, lb.LoadBalancer(feed, policy=Halves()))


def test_failing_telemetry_degrades_to_no_features(caplog, monkeypatch):
    from predictor.telemetry import Telemetry

    def broken(self):
        raise OSError("no /proc here")

    monkeypatch.setattr(Telemetry, "sample", broken)
    feed = lb.BalancedFeed(X, Y, global_batch=16)
    balancer = lb.LoadBalancer(feed, predictor="narx", warmup_steps=0)
    with caplog.at_level(logging.WARNING, logger="lbbsp"):
        hist = fit(tiny(), feed, balancer, epochs=2)
    assert len(hist.history["loss"]) == 2
    assert sum("no /proc here" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("wrap", [lambda ds: ds.prefetch(3), lambda ds: ds.shuffle(8), lambda ds: ds.batch(2)])
def test_a_wrapped_feed_is_a_clear_error_not_a_hang(wrap):
    feed = lb.BalancedFeed(X, Y, global_batch=16)
    model = tiny()
    with pytest.raises(Exception, match="wrapped|read step"):
        model.fit(wrap(feed.dataset()), steps_per_epoch=feed.steps_per_epoch, epochs=1, verbose=0,
                  callbacks=[lb.LoadBalancer(feed)])


def test_a_dataset_not_from_the_feed_is_a_clear_error():
    feed = lb.BalancedFeed(X, Y, global_batch=16)
    own = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16).repeat()
    with pytest.raises(RuntimeError, match="read nothing from the feed: pass feed.dataset()"):
        tiny().fit(own, steps_per_epoch=feed.steps_per_epoch, epochs=1, verbose=0, callbacks=[lb.LoadBalancer(feed)])


def sample_pipeline_feed(read, **kwargs):
    images = tf.constant(X)
    labels = tf.constant(Y)

    def load(index):
        read.append(None)  # traced once; the real record is the feed's served log
        return tf.gather(images, index) * 1.0, tf.gather(labels, index)

    return lb.BalancedFeed.from_sample_fn(load, len(X), global_batch=16, **kwargs)


@pytest.mark.parametrize("plan_ahead", [1, 2])  # 2: a whole step of read-ahead (README, "Input pipelines")
def test_per_sample_pipeline_with_prefetch_trains_and_reads_every_sample_once(plan_ahead):
    feed = sample_pipeline_feed([], prefetch=1)
    seen = []

    class Collect(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            epoch = len(hist_epochs)
            seen.append(feed.indices(epoch, step, balancer._plan.sizes).tolist())

        def on_epoch_end(self, epoch, logs=None):
            hist_epochs.append(epoch)

    hist_epochs = []
    balancer = lb.LoadBalancer(feed, predictor="ema", plan_ahead=plan_ahead)
    model = tiny()
    hist = model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=2, verbose=0,
                     callbacks=[balancer, Collect()])
    assert len(hist.history["loss"]) == 2 and np.isfinite(hist.history["loss"]).all()
    for epoch in range(2):
        got = sorted(i for batch in seen[epoch * feed.steps_per_epoch:(epoch + 1) * feed.steps_per_epoch]
                     for i in batch)
        assert got == list(range(len(X)))


def test_prefetch_needs_a_plan_that_far_ahead():
    feed = sample_pipeline_feed([], prefetch=2)
    with pytest.raises(ValueError, match="prefetch=2 is not allowed with plan_ahead=1"):
        tiny().fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=1, verbose=0,
                   callbacks=[lb.LoadBalancer(feed)])
    with pytest.raises(ValueError, match="prefetch=-1"):
        lb.BalancedFeed(X, Y, global_batch=16, prefetch=-1)
    with pytest.raises(ValueError, match="load=3"):
        lb.BalancedFeed.from_sample_fn(3, 10, global_batch=4)


def test_elastic_state_checks_its_arguments_and_how_it_is_trained():
    model, feed = tiny(), lb.BalancedFeed(X, Y, global_batch=16)
    balancer = lb.LoadBalancer(feed)
    with pytest.raises(ValueError, match="batches_per_commit=0 is not allowed"):
        lb.elastic.ElasticState(model, balancer, batches_per_commit=0)
    with pytest.raises(ValueError, match="balancer=None is not allowed"):
        lb.elastic.ElasticState(model, None)
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    scheduled = tiny(lb.DistributedOptimizer(tf.keras.optimizers.SGD(schedule)))
    with pytest.raises(ValueError, match="scale_batch=True is not allowed with a learning-rate schedule"):
        lb.elastic.ElasticState(scheduled, lb.LoadBalancer(lb.BalancedFeed(X, Y, global_batch=16)), scale_batch=True)
    state = lb.elastic.ElasticState(model, balancer)
    with pytest.raises(RuntimeError, match="lbbsp.keras.elastic.fit"):
        fit(model, feed, balancer, epochs=1)
    with pytest.raises(ValueError, match="steps_per_epoch is not allowed here"):
        lb.elastic.fit(state, epochs=1, steps_per_epoch=3)


def test_elastic_fit_outside_a_launcher_trains_every_epoch_once():
    model, feed = tiny(), lb.BalancedFeed(X, Y, global_batch=16)
    balancer = lb.LoadBalancer(feed, warmup_steps=0)
    state = lb.elastic.ElasticState(model, balancer, batches_per_commit=2)
    history = lb.elastic.fit(state, epochs=3, verbose=0)
    assert state.epoch == 3 and len(history.history["loss"]) == 3
    assert state.lbbsp["position"] == 0 and state.lbbsp["epoch"] == 3 and state.lbbsp["workers"] == [
        lb.worker_identity()]
    assert lb.elastic.fit(state, epochs=3) is None, "nothing left to train"


@pytest.mark.parametrize("global_batch, batch_multiple, gpu, grid", [
    (64, None, False, 1), (64, None, True, 8), (16, None, True, 2), (64, 1, True, 1), (64, 4, False, 4)])
def test_the_feeds_batch_grid_reaches_the_policy(global_batch, batch_multiple, gpu, grid):
    policy = Policy()
    x = np.zeros((2 * global_batch, 3), dtype=np.float32)
    feed = lb.BalancedFeed(x, x[:, :1], global_batch=global_batch, batch_multiple=batch_multiple)
    with mock.patch("lbbsp.keras.callbacks._on_gpu", return_value=gpu):  # a worker that claims a GPU
        fit(tiny(), feed, lb.LoadBalancer(feed, policy=policy), epochs=1)
    assert policy.bounds.multiple == feed.grid == grid


def test_warm_shapes_are_set_up_before_training_and_known_to_the_policy(caplog):
    feed = lb.BalancedFeed(X, Y, global_batch=16)
    balancer = lb.LoadBalancer(feed, warm_shapes=[8, 12], warmup_steps=0)
    model = tiny()
    model.build((None, 3))
    before = [w.copy() for w in model.get_weights()]
    with caplog.at_level(logging.INFO, logger="lbbsp"):
        balancer.set_model(model)
        balancer.params = {"steps": feed.steps_per_epoch}
        balancer.on_train_begin()
    assert "set up 2 batch shapes [8, 12]" in caplog.text
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights())), "no update, no statistics"
    assert not balancer.controller.policy.model.new_shapes([8]).any()
    balancer.on_train_end()
    with pytest.raises(ValueError, match="warm_shapes=.*list of batch sizes"):
        lb.LoadBalancer(feed, warm_shapes=[0])
    wide = lb.LoadBalancer(lb.BalancedFeed(X, Y, global_batch=16, b_min=4), warm_shapes=[2, 8, 40])
    wide.set_model(model)
    wide.params = {"steps": feed.steps_per_epoch}
    # A single worker runs batches of 4 to 16 here.
    with pytest.raises(ValueError, match=r"warm_shapes=\[2, 8, 40\] is not allowed: \[2, 40\] lie outside .*\[4, 16\]"):
        wide.on_train_begin()


def test_keras_3_is_refused_with_the_fix():
    from types import SimpleNamespace

    from lbbsp.keras.compat import check_keras

    fake = SimpleNamespace(__version__="2.21.0", keras=SimpleNamespace(__version__="3.11.3"))
    with pytest.raises(ImportError, match=r"pip install 'tf-keras==2\.21\.\*'.*TF_USE_LEGACY_KERAS=1"):
        check_keras(fake)
    assert check_keras(tf).split(".")[0] == "2"
