"""Real heterogeneity on one machine: cgroup CPU quotas, co-located CPU hogs, core pinning.

Used by the benchmarks, the trace recorder and the tests (never by the
library). `CpuQuota` does what `docker --cpus` does (cgroup v1
`cpu.cfs_quota_us`, or v2 `cpu.max`) and can change the quota while a worker
runs; `CpuHog` is a busy process pinned next to a worker, the non-dedicated
setting LB-BSP targets, switched on and off instantly (SIGCONT/SIGSTOP).
"""
import logging
import os
import signal
import subprocess
import sys
import uuid

__all__ = ["cgroup_root", "cgroups_writable", "CpuQuota", "CpuHog", "MemoryHog", "pin_to_cores"]

log = logging.getLogger(__name__)

_V1 = "/sys/fs/cgroup/cpu"
_V2 = "/sys/fs/cgroup"


def cgroup_root():
    """(root directory, version) of a writable cgroup CPU controller, or (None, None)."""
    if os.path.exists(os.path.join(_V1, "cpu.cfs_quota_us")) and os.access(_V1, os.W_OK):
        return _V1, 1
    controllers = os.path.join(_V2, "cgroup.controllers")
    if os.path.exists(controllers) and os.access(_V2, os.W_OK):
        try:
            with open(controllers) as fh:
                if "cpu" in fh.read().split():
                    return _V2, 2
        except OSError:
            pass
    return None, None


def cgroups_writable():
    """True when CpuQuota can be used here (root with a cgroup CPU controller)."""
    root, _ = cgroup_root()
    if root is None:
        return False
    try:
        with CpuQuota(1.0):
            return True
    except OSError:
        return False


class CpuQuota:
    """A cgroup limiting its processes to `cores` CPUs; `set(cores)` changes it live.

    Use as a context manager; on exit the processes go back to the root group
    and the group is removed.
    """

    def __init__(self, cores, pids=(), period_us=10000, name=None):
        root, version = cgroup_root()
        if root is None:
            raise OSError("no writable cgroup CPU controller (needs root and cgroup v1 cpu or v2 with cpu)")
        self.root, self.version, self.period_us = root, version, int(period_us)
        self.path = os.path.join(root, name or f"lbbsp-{uuid.uuid4().hex[:8]}")
        os.makedirs(self.path, exist_ok=True)
        self.cores = None
        self.set(cores)
        for pid in pids:
            self.add(pid)

    def _write(self, name, value):
        with open(os.path.join(self.path, name), "w") as fh:
            fh.write(str(value))

    def set(self, cores):
        """Limit the group to `cores` CPUs (a float > 0), or lift the limit with None."""
        if cores is not None and not (isinstance(cores, (int, float)) and cores > 0):
            raise ValueError(f"cores={cores!r} is not allowed: give a number > 0 or None")
        if self.version == 1:
            self._write("cpu.cfs_period_us", self.period_us)
            self._write("cpu.cfs_quota_us", -1 if cores is None else max(int(cores * self.period_us), 1000))
        else:
            quota = "max" if cores is None else str(max(int(cores * self.period_us), 1000))
            self._write("cpu.max", f"{quota} {self.period_us}")
        self.cores = cores

    def add(self, pid):
        """Move process `pid` (all its threads) into the group."""
        self._write("cgroup.procs", int(pid))

    def throttled_seconds(self):
        """Total time the group was throttled (cpu.stat), in seconds."""
        try:
            with open(os.path.join(self.path, "cpu.stat")) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "throttled_time":
                        return int(value) / 1e9
                    if key == "throttled_usec":
                        return int(value) / 1e6
        except OSError:
            pass
        return 0.0

    def pids(self):
        with open(os.path.join(self.path, "cgroup.procs")) as fh:
            return [int(line) for line in fh if line.strip()]

    def close(self):
        for pid in self.pids():
            try:
                with open(os.path.join(self.root, "cgroup.procs"), "w") as fh:
                    fh.write(str(pid))
            except OSError:
                pass
        try:
            os.rmdir(self.path)
        except OSError as exc:
            log.warning("could not remove cgroup %s: %s", self.path, exc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CpuHog:
    """A busy-looping process pinned to `cores`: `start()` runs it, `stop()` pauses it, `close()` ends it.

    The process is spawned once; switching is a signal (SIGCONT/SIGSTOP), so
    a scenario event takes effect at once and costs the worker nothing.
    """

    def __init__(self, cores):
        self.cores = sorted(int(c) for c in cores)
        self._proc = None
        self.running = False

    def _code(self):
        return f"import os; os.sched_setaffinity(0, {self.cores!r})\nwhile True: pass"

    def _alive(self):
        return self._proc is not None and self._proc.poll() is None

    def start(self):
        if self.running:
            return
        if self._alive():
            self._proc.send_signal(signal.SIGCONT)
        else:
            self._proc = subprocess.Popen([sys.executable, "-c", self._code()], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.running = True

    def stop(self):
        if self.running and self._alive():
            self._proc.send_signal(signal.SIGSTOP)
        self.running = False

    def close(self):
        if self._alive():
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()
        self._proc = None
        self.running = False

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()


class MemoryHog(CpuHog):
    """A process that holds `megabytes` of memory and keeps rewriting it; `stop()` ends it (frees the memory)."""

    def __init__(self, cores, megabytes=1024):
        super().__init__(cores)
        self.megabytes = int(megabytes)

    def _code(self):
        return (f"import os; os.sched_setaffinity(0, {self.cores!r})\n"
                f"buf = bytearray({self.megabytes} * 2**20)\n"
                "while True:\n"
                "    for i in range(0, len(buf), 4096): buf[i] = (buf[i] + 1) & 255\n")

    def stop(self):
        self.close()


def pin_to_cores(cores, pid=None):
    """Restrict every thread of `pid` (default: this process) to the given CPU cores.

    sched_setaffinity acts on one thread; TensorFlow's and Horovod's thread
    pools already exist, so each task of the process is pinned.
    """
    cores = set(int(c) for c in cores)
    pid = os.getpid() if pid is None else int(pid)
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:
            pass  # the thread ended meanwhile
