"""GPU speed traces measured on an NVIDIA H200 and an H100, read into the predictor's trace format.

    python -m predictor.gpu_traces SOURCE_DIR      # writes predictor/data/traces/gpu_*.csv.gz

trace_gpu_nvml becomes gpu_nvml_train (its first 70%, GPU model training) and
gpu_nvml_test (the last 30%, predictor.evaluate --device gpu).

SOURCE_DIR holds `trace_resnet50_vb.csv`, `trace_gpu_nvml.csv` or both, as the
measurement scripts wrote them (docs/gpu.md), and the scripts' `info.json`
naming the card (without one: the H200, which the first measurements did not
record); the traces of a card other than the H200 get its name as a suffix
(gpu_resnet50_vb_h100). Each is ResNet-50 training steps with
the batch drawn per step from 32..256 and a co-located job on the same GPU
coming and going. Each becomes a trace like the CPU *_vb traces:

- `speed` is the batch-free speed (b + k) / t, with the fixed cost k fitted
  over the trace's steps above the floor (b >= 96) without a co-tenant;
- GPU features (predictor.nvml) from the recorded NVML readings: SM clock
  over the card's maximum and power over its limit, other processes' memory
  over the card's memory (CARDS), the throttle bits; gpu_mem_used was
  not recorded (neutral). trace_resnet50_vb recorded no process list: its
  co-located job was started, and waited for, before its state was set, so
  gpu_procs is 1 exactly while `hog` > 0 (and its memory that of the
  8192 x 8192 job, 1130 MiB, as trace_gpu_nvml measured it);
- CPU features: sys_cpu and proc_cpu where recorded (as fractions of the 16
  cores), the others neutral;
- `hog`, the injected state whose changes are the change points of
  predictor.evaluate: the co-tenant's duty while it runs (trace_gpu_nvml:
  phase "running"; its start-up does not slow the worker yet), else 0.
"""
import csv
import json
import os
import sys
from typing import NamedTuple

import numpy as np

from .nvml import POWER_CAP, SLOWDOWN
from .telemetry import FEATURES, NEUTRAL
from .traces import TRACE_DIR, write_trace

__all__ = ["fixed_cost", "convert", "card_of", "trace_name", "main", "SOURCES", "CARDS"]


class Card(NamedTuple):
    """What a GPU's NVML readings are scaled by, and the suffix of its traces' names."""

    suffix: str
    max_sm_mhz: float
    power_limit_w: float
    memory_mib: float


#: nvidia-smi's readings of the measured cards (SXM, 700 W both); the H200's traces keep their first names.
CARDS = {"h200": Card("", 1980.0, 700.0, 143771.0), "h100": Card("_h100", 1980.0, 700.0, 81559.0)}
CORES = 16
#: Memory of the 8192 x 8192 co-located job (trace_gpu_nvml's other_mem_mb while it runs).
COTENANT_MIB = 1130.0
#: source file -> trace name
SOURCES = {"trace_resnet50_vb.csv": "gpu_resnet50_vb", "trace_gpu_nvml.csv": "gpu_nvml"}
#: trace_gpu_nvml is split in time: the GPU models train on its first 70%, predictor.evaluate scores its last 30%.
TRAIN_SHARE = 0.7


def fixed_cost(batches, times):
    """k in samples from a least-squares line t = c + s b (k = c / s)."""
    slope, intercept = np.polyfit(np.asarray(batches, dtype=np.float64), np.asarray(times, dtype=np.float64), 1)
    return float(intercept / slope)


def trace_name(trace, card):
    """The name under which `trace` (e.g. "gpu_resnet50_vb") measured on `card` (a CARDS key) is shipped."""
    return trace + CARDS[card].suffix


def card_of(source_dir):
    """The CARDS key of the GPU named in SOURCE_DIR's info.json; "h200" where there is none."""
    path = os.path.join(source_dir, "info.json")
    if not os.path.exists(path):
        return "h200"
    with open(path) as fh:
        gpu = json.load(fh).get("gpu", "")
    names = [name for name in CARDS if name.upper() in gpu.upper()]
    if len(names) != 1:
        raise ValueError(f"info.json names gpu={gpu!r}: the cards known are {sorted(CARDS)}")
    return names[0]


def convert(path, card="h200"):
    """(rows, comments) of the trace at `path`, measured on `card` (a CARDS key), in the predictor's format
    (predictor.traces.write_trace)."""
    if card not in CARDS:
        raise ValueError(f"card={card!r} is not allowed: use one of {sorted(CARDS)}")
    scale = CARDS[card]
    with open(path, newline="") as fh:
        raw = list(csv.DictReader(fh))
    nvml = "other_procs" in raw[0]
    batch = np.array([float(r["batch"]) for r in raw])
    time = np.array([float(r["step_time"]) for r in raw])
    if nvml:
        hog = np.array([float(r["cotenant_duty"]) if r["cotenant_phase"] == "running" else 0.0 for r in raw])
        alone = np.array([r["cotenant_phase"] == "off" for r in raw])
    else:
        hog = np.array([float(r["hog"]) for r in raw])
        alone = hog == 0
    line = alone & (batch >= 96)
    k = fixed_cost(batch[line], time[line])
    rows = []
    for i, r in enumerate(raw):
        reasons = int(r.get("throttle_reasons", 0))
        procs = float(r["other_procs"]) if nvml else float(hog[i] > 0)
        other = float(r["other_mem_mb"]) if nvml else COTENANT_MIB * procs
        row = dict(zip(FEATURES, map(float, NEUTRAL)))
        row.update(step=i, time=float(r["time"]), batch=batch[i], step_time=time[i],
                   speed=(batch[i] + k) / time[i], hog=hog[i], quota=0.0, mem=0.0,
                   gpu_procs=procs, gpu_other_mem=other / scale.memory_mib,
                   gpu_sm_clock=float(r["sm_clock"]) / scale.max_sm_mhz,
                   gpu_power=float(r["power_w"]) / scale.power_limit_w,
                   gpu_power_cap=float(bool(reasons & POWER_CAP)), gpu_slowdown=float(bool(reasons & SLOWDOWN)))
        if "sys_cpu" in r:
            row.update(sys_cpu=float(r["sys_cpu"]) / 100.0, proc_cpu=float(r["proc_cpu"]) / 100.0 / CORES)
        rows.append(row)
    comments = [f"converted by python -m predictor.gpu_traces from {os.path.basename(path)} (ResNet-50 on one "
                f"NVIDIA {card.upper()}, PyTorch, bf16; a co-located job on the same GPU comes and goes)",
                f"batch drawn per step; speed is the batch-free speed (b + k) / t with fixed cost k = {k:.2f} samples "
                "(least squares of step time on batch over the steps at b >= 96 without a co-tenant)",
                "hog: the co-located job's duty cycle while it runs (0: none)"]
    return rows, comments


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not any(os.path.exists(os.path.join(argv[0], name)) for name in SOURCES):
        print(f"usage: python -m predictor.gpu_traces SOURCE_DIR (holding {' or '.join(SOURCES)})", file=sys.stderr)
        return 2
    try:
        card = card_of(argv[0])
    except ValueError as error:
        print(f"python -m predictor.gpu_traces: {error}", file=sys.stderr)
        return 2
    for name, trace in SOURCES.items():
        if not os.path.exists(os.path.join(argv[0], name)):
            continue
        rows, comments = convert(os.path.join(argv[0], name), card)
        parts = {trace_name(trace, card): (0, len(rows))}
        if trace == "gpu_nvml":
            cut = int(round(TRAIN_SHARE * len(rows)))
            parts = {trace_name(f"{trace}_train", card): (0, cut), trace_name(f"{trace}_test", card): (cut, len(rows))}
        for part, (start, stop) in parts.items():
            out = os.path.join(TRACE_DIR, f"{part}.csv.gz")
            write_trace(out, rows[start:stop], comments + [f"steps {start} to {stop} of the measured trace"])
            print(f"{out}: {stop - start} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
