"""Cheap per-step readings of what drives a worker's speed (the NARX model's exogenous inputs).

Each feature is scale-free (a fraction or a rate normalised by the machine),
so one model serves any machine. A counter that cannot be read on this
machine reads as its neutral value, never as an error. CPU and memory
(psutil, /proc, cgroup files):

==================  =====================================================  ========
feature             meaning                                                neutral
==================  =====================================================  ========
proc_cpu            CPU seconds this process used per wall second,         0
                    divided by the cores it may use (affinity and quota)
sys_cpu             busy fraction of all cores since the last sample       0
run_queue           runnable tasks on the machine per core of the machine  0
mem_available       available memory / total memory                        1
proc_rss            this process's resident memory / total memory          0
cpu_quota           cgroup CPU quota in cores / cores in the affinity set  1
throttled           fraction of the wall time the cgroup was throttled     0
ctx_involuntary     involuntary context switches per ms of wall time       0
==================  =====================================================  ========

and, on a GPU worker, its GPU's (predictor.nvml; neutral without one):
GPU_FEATURES.
"""
import os
import resource
import time

import numpy as np
import psutil

from .nvml import GPU_FEATURES, GPU_NEUTRAL

__all__ = ["CPU_FEATURES", "FEATURES", "NEUTRAL", "Telemetry", "QuotaReader", "cgroup_cpu_dir"]

CPU_FEATURES = ("proc_cpu", "sys_cpu", "run_queue", "mem_available", "proc_rss", "cpu_quota", "throttled",
                "ctx_involuntary")
#: Every reading, CPU first, and the value each reads where it cannot be read.
FEATURES = CPU_FEATURES + GPU_FEATURES
NEUTRAL = np.concatenate([[0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0], GPU_NEUTRAL])


def _read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def cgroup_cpu_dir(pid="self"):
    """Directory of the cgroup (v1 cpu controller, or v2 unified) that holds `pid`, or None."""
    text = _read(f"/proc/{pid}/cgroup")
    if not text:
        return None
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            for root in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
                if os.path.exists(root + path + "/cpu.cfs_quota_us"):
                    return root + path.rstrip("/")
    for line in text.splitlines():
        if line.startswith("0::"):
            path = "/sys/fs/cgroup" + line[3:].strip()
            if os.path.exists(path + "/cpu.max"):
                return path.rstrip("/")
    return None


def quota_cores(cgroup):
    """The CPU quota of the cgroup directory `cgroup` in cores (v2 cpu.max or v1 cfs files); None without one."""
    if cgroup is None:
        return None
    text = _read(cgroup + "/cpu.max")
    if text is not None:
        quota, _, period = text.partition(" ")
        return None if quota == "max" else float(quota) / float(period)
    quota, period = _read(cgroup + "/cpu.cfs_quota_us"), _read(cgroup + "/cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0:
        return None
    return int(quota) / int(period)


class QuotaReader:
    """This process's CPU quota as a share of one core, re-read every `every` reads (a quota may change while
    a job runs); a reading that fails counts as no quota."""

    def __init__(self, every=10):
        self.cgroup = cgroup_cpu_dir()
        self._every, self._reads, self._cores = max(int(every), 1), 0, None

    def share(self):
        """The quota in cores, capped at 1 (1 without one). A CFS quota lets the process run at full speed until
        the period's quota is spent, then stalls it: x seconds of CPU cost x / share seconds of wall time."""
        if self._reads % self._every == 0:
            try:
                self._cores = quota_cores(self.cgroup)
            except (OSError, ValueError):
                self._cores = None
        self._reads += 1
        return min(self._cores, 1.0) if self._cores else 1.0


class _ProcFile:
    """A /proc or /sys file kept open and re-read with pread (cheaper than opening it at every sample)."""

    def __init__(self, path):
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self):
        if self._fd is None:
            return None
        try:
            return os.pread(self._fd, 65536, 0).decode()
        except OSError:
            return None

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Telemetry:
    """Samples FEATURES for the current process.

    The fast readings (CPU, run queue, context switches, throttling) are taken
    at every call; memory and the quota change slowly and are refreshed every
    `slow_every` calls. A sample costs tens of microseconds. `gpu`: the
    predictor.nvml.NVMLReader of this worker's GPU, or None (neutral GPU features).
    """

    features = FEATURES

    def __init__(self, slow_every=10, gpu=None):
        self.gpu = gpu
        self._proc = psutil.Process()
        self._cores = max(len(os.sched_getaffinity(0)), 1)
        self._machine_cores = os.cpu_count() or 1
        self._total_mem = float(psutil.virtual_memory().total)
        self._slow_every = max(int(slow_every), 1)
        self._stat = _ProcFile("/proc/stat")
        cgroup = cgroup_cpu_dir()
        self._cpu_stat = _ProcFile(cgroup + "/cpu.stat") if cgroup else _ProcFile("")
        self._cgroup = cgroup
        self._calls = 0
        self._slow = NEUTRAL[3:6].copy()
        self._last = None
        self.sample()

    def close(self):
        self._stat.close()
        self._cpu_stat.close()
        if self.gpu is not None:
            self.gpu.close()

    def _throttled_seconds(self):
        text = self._cpu_stat.read()
        if not text:
            return 0.0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_time":
                return int(value) / 1e9
            if key == "throttled_usec":
                return int(value) / 1e6
        return 0.0

    def _system(self):
        """(busy jiffies, total jiffies, runnable tasks) from one read of /proc/stat."""
        text = self._stat.read()
        if not text:
            return 0.0, 0.0, 0.0
        first = text.split("\n", 1)[0].split()[1:]
        values = [float(v) for v in first]
        idle = values[3] + (values[4] if len(values) > 4 else 0.0)
        at = text.find("procs_running ")
        running = float(text[at + 14:text.index("\n", at)]) if at >= 0 else 0.0
        return sum(values) - idle, sum(values), running

    def _refresh_slow(self):
        quota = quota_cores(self._cgroup)
        self._quota = quota
        self._allowed = min(self._cores, quota) if quota else self._cores
        self._slow = np.array([
            psutil.virtual_memory().available / self._total_mem,
            self._proc.memory_info().rss / self._total_mem,
            (quota / self._cores) if quota else 1.0,
        ])

    def _counters(self):
        usage = resource.getrusage(resource.RUSAGE_SELF)  # microseconds, where os.times() counts 10 ms ticks
        busy, total, running = self._system()
        return {
            "wall": time.monotonic(),
            "proc_cpu": usage.ru_utime + usage.ru_stime,
            "sys_busy": busy,
            "sys_total": total,
            "running": running,
            "ctx": usage.ru_nivcsw,
            "throttled": self._throttled_seconds() if self._quota else 0.0,
        }

    def sample(self):
        """The FEATURES vector since the previous call (the first call returns the neutral values)."""
        if self._calls % self._slow_every == 0:
            self._refresh_slow()
        self._calls += 1
        now = self._counters()
        last, self._last = self._last, now
        if last is None:
            return NEUTRAL.copy()
        wall = max(now["wall"] - last["wall"], 1e-6)
        sys_total = now["sys_total"] - last["sys_total"]
        gpu = self.gpu.sample() if self.gpu is not None else GPU_NEUTRAL
        return np.concatenate([[
            (now["proc_cpu"] - last["proc_cpu"]) / wall / self._allowed,
            (now["sys_busy"] - last["sys_busy"]) / sys_total if sys_total > 0 else 0.0,
            now["running"] / self._machine_cores,
            self._slow[0],
            self._slow[1],
            self._slow[2],
            (now["throttled"] - last["throttled"]) / wall,
            (now["ctx"] - last["ctx"]) / (wall * 1e3),
        ], gpu])
