"""Stray slow steps of ResNet-50 training on one GPU (docs/gpu.md, "A second card"): 400 steps each at batch 256
alone, with NVML read after every step (as ../shared/gpu/trace_gpu.py does), with NVML read every 50 ms on a
background thread (as lbbsp's reader does), with the batch drawn per step from 128/192/256, and alone again.
Prints per condition the share of steps over 1.1x / 1.3x their batch's median and the largest; writes every
step time to $OUT/stray.csv (benchmarks/data/gpu_stray_h100.csv, gpu_stray_h200.csv). Needs a CUDA machine
with torch, torchvision and nvidia-ml-py, not lbbsp's environment: OUT=out python scripts/gpu_stray_steps.py
(STEPS: steps per case)."""
import csv
import os
import random
import threading
import time

import pynvml
import torch
import torch.nn as nn
import torchvision

OUT = os.environ.get("OUT", "out")
os.makedirs(OUT, exist_ok=True)
torch.backends.cudnn.benchmark = True
dev = "cuda"
m = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
data = {b: (torch.randn((b, 3, 224, 224), device=dev).to(memory_format=torch.channels_last),
            torch.randint(0, 1000, (b,), device=dev)) for b in (128, 192, 256)}


def step(b):
    x, y = data[b]
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(m(x), y)
    loss.backward()
    opt.step()


def timed(b):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    step(b)
    e.record()
    e.synchronize()
    return s.elapsed_time(e)


for b in data:
    for _ in range(4):
        step(b)
torch.cuda.synchronize()
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)


def read():
    pynvml.nvmlDeviceGetUtilizationRates(h)
    pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
    pynvml.nvmlDeviceGetPowerUsage(h)
    pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    pynvml.nvmlDeviceGetComputeRunningProcesses(h)


stop = threading.Event()


def reader():
    while not stop.is_set():
        read()
        time.sleep(0.05)


rows = []
rng = random.Random(0)
N = int(os.environ.get("STEPS", "400"))
conds = ["alone", "nvml_per_step", "nvml_thread", "batch_drawn", "alone_again"]
for cond in conds:
    th = None
    if cond == "nvml_thread":
        stop.clear()
        th = threading.Thread(target=reader, daemon=True)
        th.start()
    ts = []
    for i in range(N):
        b = rng.choice([128, 192, 256]) if cond == "batch_drawn" else 256
        ms = timed(b)
        if cond == "nvml_per_step":
            read()
        ts.append((b, ms))
        rows.append(dict(cond=cond, step=i, batch=b, ms=round(ms, 4)))
    if th:
        stop.set()
        th.join()
    for bb in sorted({b for b, _ in ts}):
        x = sorted(ms for b, ms in ts if b == bb)
        med = x[len(x) // 2]
        over = lambda f: sum(v > f * med for v in x) / len(x)
        print(f"{cond:14s} b={bb:3d} n={len(x):4d} median {med:7.3f} ms  >1.1x {over(1.1):.3f}  "
              f">1.3x {over(1.3):.3f}  max {x[-1] / med:.2f}x", flush=True)
with open(os.path.join(OUT, "stray.csv"), "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print("done")
