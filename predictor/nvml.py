"""A GPU worker's readings from NVML (nvidia-ml-py), for its speed predictor: what a co-tenant on its GPU does.

On a GPU, contention is mostly another job's kernels on the same device, and
the host's CPU readings barely move. NVML lists a co-located compute process
a few steps before that process slows the worker (../gpu measurements, in
docs/gpu.md), and the SM clock falls under the heaviest co-tenants. Features,
scale-free like the CPU ones:

================  ==========================================================  ========
feature           meaning                                                     neutral
================  ==========================================================  ========
gpu_procs         other compute processes on this GPU (capped at 4)           0
gpu_other_mem     their memory / the GPU's total memory                       0
gpu_sm_clock      SM clock / its maximum                                      1
gpu_power         power draw / the enforced power limit                       0
gpu_power_cap     1 while the clocks are held by the software power cap       0
gpu_slowdown      1 while a hardware, thermal or power-brake slowdown holds   0
gpu_mem_used      memory used (all processes) / total memory                  0
================  ==========================================================  ========

In a container NVML lists processes by their host PIDs, which this process
cannot match to its own; when none of them is its own, the one using the
most GPU memory is taken for it (a training job is usually its GPU's
largest user), so a worker alone on its GPU still reads no co-tenant.

The reader is optional: without the library, without a GPU, or when NVML
raises, every reading is neutral and one line is logged, never an error. It
reads on a thread of its own every `period` seconds and hands each reading
over as an immutable tuple, so a training step only takes the latest one.
"""
import logging
import os
import threading

import numpy as np

__all__ = ["GPU_FEATURES", "GPU_NEUTRAL", "NVMLReader", "device_for"]

log = logging.getLogger(__name__)

GPU_FEATURES = ("gpu_procs", "gpu_other_mem", "gpu_sm_clock", "gpu_power", "gpu_power_cap", "gpu_slowdown",
                "gpu_mem_used")
GPU_NEUTRAL = np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
#: NVML's clock throttle reason bits: the software power cap; hardware slowdown, software and hardware
#: thermal slowdown, hardware power brake.
POWER_CAP, SLOWDOWN = 0x4, 0x8 | 0x20 | 0x40 | 0x80
MAX_PROCS = 4


def device_for(local_rank, visible=None):
    """The NVML device (an index, or a UUID string) of the GPU this rank trains on: entry `local_rank` of
    CUDA_VISIBLE_DEVICES (its only entry where each rank sees one GPU), else the GPU numbered `local_rank`."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    if not entries:
        return int(local_rank)
    entry = entries[0] if len(entries) == 1 else entries[int(local_rank) % len(entries)]
    return int(entry) if entry.isdigit() else entry


def _memory(process):
    """A listed process's GPU memory in bytes (NVML may not report it: 0)."""
    return float(getattr(process, "usedGpuMemory", 0) or 0)


def _load():
    import pynvml  # nvidia-ml-py
    return pynvml


class NVMLReader:
    """GPU_FEATURES of one GPU, read on a background thread (see the module docstring).

    `device`: an NVML index or UUID (`device_for`); `nvml`: the pynvml module (tests pass a fake).
    """

    def __init__(self, device=0, period=0.05, nvml=None):
        self.period = float(period)
        self._latest = tuple(GPU_NEUTRAL)
        self._stop = threading.Event()
        self._thread = None
        self.available = False
        try:
            self._nvml = nvml if nvml is not None else _load()
            self._nvml.nvmlInit()
            get = self._nvml.nvmlDeviceGetHandleByUUID if isinstance(device, str) else \
                self._nvml.nvmlDeviceGetHandleByIndex
            self._handle = get(device)
            self._max_clock = float(self._nvml.nvmlDeviceGetMaxClockInfo(self._handle, self._nvml.NVML_CLOCK_SM))
            self._limit = float(self._nvml.nvmlDeviceGetEnforcedPowerLimit(self._handle))
            self._total = float(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).total)
            self._reasons = getattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                self._nvml.nvmlDeviceGetCurrentClocksThrottleReasons
            self._latest = self.read()
        except Exception as exc:  # noqa: BLE001 - no GPU readings is never an error
            log.info("predictor: no GPU readings (%r); the GPU features stay neutral", exc)
            return
        self.available = True

    def read(self):
        """One round of NVML queries: the GPU_FEATURES as a tuple (raises what NVML raises)."""
        nvml, handle = self._nvml, self._handle
        me, procs = os.getpid(), list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        others = [p for p in procs if p.pid != me]
        if others and len(others) == len(procs):
            # In a container NVML lists host PIDs (the driver does not translate PID namespaces), so this
            # process is listed under a PID it cannot know: the one using the most memory is taken for it.
            others.remove(max(others, key=_memory))
        other_mem = sum(map(_memory, others))
        reasons = int(self._reasons(handle))
        return (float(min(len(others), MAX_PROCS)), other_mem / self._total,
                nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM) / self._max_clock,
                nvml.nvmlDeviceGetPowerUsage(handle) / self._limit, float(bool(reasons & POWER_CAP)),
                float(bool(reasons & SLOWDOWN)), float(nvml.nvmlDeviceGetMemoryInfo(handle).used) / self._total)

    def start(self):
        """Read every `period` seconds on a daemon thread until `close`."""
        if self.available and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lbbsp-nvml", daemon=True)
            self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.period):
            try:
                self._latest = self.read()
            except Exception as exc:  # noqa: BLE001 - a failing GPU reading degrades to neutral, once
                log.warning("predictor: NVML failed (%r); the GPU features are neutral from now on", exc)
                self._latest, self.available = tuple(GPU_NEUTRAL), False
                return

    def sample(self):
        """The latest reading (neutral without NVML), as an array."""
        return np.array(self._latest)

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
