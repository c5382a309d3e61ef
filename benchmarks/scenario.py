"""Benchmark scenarios: how many workers, how fast each is, and how that changes during training (YAML files).

    name: static-4
    description: four workers at 1 : 1 : 0.5 : 0.25
    workers: 4
    workload: conv           # benchmarks.workloads: mlp, conv, images or cnn
    global_batch: 512
    epochs: 4
    num_samples: 4096        # optional: training samples of a synthetic workload
    hidden: 1024             # width of the mlp
    scale: 0.6               # cores given to a worker of relative speed 1.0
    speeds: [1, 1, 0.5, 0.25]
    events:                  # optional; `step` counts steps from the start of training
      - {step: 40, worker: 1, speed: 0.25}
      - {step: 80, worker: 0, hog: true}
    period: 120              # optional: the events repeat every 120 steps (from the initial speeds)

A worker of relative speed s runs under a cgroup CPU quota of s * scale
cores (what `docker --cpus` does); a `hog` event switches a busy process on
(true) or off (false) on the worker's core. Events are applied at the start
of the named step on every rank, so every rank knows every worker's state at
every step (the oracle needs no exchange). Workers are pinned round-robin to
the cores. Where cgroups are not writable the speeds are emulated by a delay
proportional to the batch size (labelled "emulated" in all output).
"""
import os

import numpy as np
import yaml

__all__ = ["Scenario", "SCENARIO_DIR", "list_scenarios"]

SCENARIO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios")
#: A busy process on a worker's core leaves it about half of that core (CFS shares it evenly).
HOG_SHARE = 0.5


class Scenario:
    """A validated scenario file."""

    def __init__(self, data, source="<dict>"):
        def need(key, kind, check, allowed):
            value = data.get(key)
            if not isinstance(value, kind) or isinstance(value, bool) or not check(value):
                raise ValueError(f"{source}: {key}={value!r} is not allowed: {allowed}")
            return value

        self.source = source
        self.name = need("name", str, bool, "a non-empty string")
        self.description = str(data.get("description", ""))
        self.workers = need("workers", int, lambda v: v >= 1, "an integer >= 1")
        self.workload = need("workload", str, lambda v: v in ("mlp", "conv", "images", "cnn"),
                             "'mlp', 'conv', 'images' or 'cnn'")
        self.global_batch = need("global_batch", int, lambda v: v >= self.workers, "an integer >= workers")
        self.epochs = need("epochs", int, lambda v: v >= 2, "an integer >= 2 (the first epoch is warm-up)")
        self.hidden = data.get("hidden", 512)
        self.num_samples = data.get("num_samples", 8192)
        if isinstance(self.num_samples, bool) or not isinstance(self.num_samples, int) or \
                self.num_samples < self.global_batch:
            raise ValueError(f"{source}: num_samples={self.num_samples!r} is not allowed: an integer >= global_batch")
        self.scale = float(need("scale", (int, float), lambda v: 0 < v <= 1, "a number in (0, 1]"))
        speeds = data.get("speeds")
        if not isinstance(speeds, list) or len(speeds) != self.workers or \
                not all(isinstance(s, (int, float)) and 0 < s <= 1 for s in speeds):
            raise ValueError(f"{source}: speeds={speeds!r} is not allowed: {self.workers} numbers in (0, 1]")
        self.speeds = [float(s) for s in speeds]
        self.events = []
        for event in data.get("events", []) or []:
            if not isinstance(event, dict) or isinstance(event.get("step"), bool) or \
                    not isinstance(event.get("step"), int) or event["step"] < 0 or \
                    event.get("worker") not in range(self.workers) or not ({"speed", "hog"} & set(event)):
                raise ValueError(f"{source}: event {event!r} is not allowed: give step (an integer >= 0), worker "
                                 f"(0..{self.workers - 1}) and speed (0, 1] and/or hog (true/false)")
            if "speed" in event and not 0 < float(event["speed"]) <= 1:
                raise ValueError(f"{source}: event {event!r}: speed must be in (0, 1]")
            self.events.append(dict(event))
        self.events.sort(key=lambda e: e["step"])
        period = data.get("period")
        if period is not None and (not isinstance(period, int) or isinstance(period, bool) or
                                   period <= 0 or (self.events and self.events[-1]["step"] >= period)):
            raise ValueError(f"{source}: period={period!r} is not allowed: a number of steps after the last event")
        self.period = period

    @classmethod
    def load(cls, path):
        """A scenario from a YAML file path or the name of a file in benchmarks/scenarios/."""
        if not os.path.exists(path):
            candidate = os.path.join(SCENARIO_DIR, f"{path}.yaml")
            if not os.path.exists(candidate):
                raise ValueError(f"scenario={path!r} is not allowed: no such file; known: {list_scenarios()}")
            path = candidate
        with open(path) as fh:
            data = yaml.safe_load(fh)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: not a scenario mapping")
        return cls(data, source=path)

    def state(self, worker, step):
        """(relative speed, hog on?) of `worker` at global step `step` (counted from the start of training)."""
        speed, hog = self.speeds[worker], False
        if self.period:
            step %= self.period
        for event in self.events:
            if event["step"] > step:
                break
            if event["worker"] == worker:
                speed = float(event.get("speed", speed))
                hog = bool(event.get("hog", hog))
        return speed, hog

    def states(self, worker):
        """Every distinct (speed, hog) state `worker` passes through."""
        steps = [0] + [e["step"] for e in self.events]
        return sorted({self.state(worker, s) for s in steps})

    def cores_given(self, worker, step):
        """Nominal cores of the worker at `step`: its quota, or what a hog leaves of its core."""
        speed, hog = self.state(worker, step)
        cores = speed * self.scale
        return min(cores, HOG_SHARE) if hog else cores

    def cores(self, worker):
        """Core a worker is pinned to: round-robin over this machine's cores."""
        available = sorted(os.sched_getaffinity(0))
        return [available[worker % len(available)]]


def list_scenarios():
    return sorted(f[:-5] for f in os.listdir(SCENARIO_DIR) if f.endswith(".yaml"))
