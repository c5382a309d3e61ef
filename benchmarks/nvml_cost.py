"""What the GPU readings cost a training step: NVML's queries (on the reader's thread) and taking the latest
reading (on the step's critical path), on a real GPU.

    python -m benchmarks.nvml_cost [--reads 500] [--cotenant]

Needs nvidia-ml-py and a GPU (no TensorFlow). With --cotenant a second process keeps the GPU busy with
matrix products (PyTorch), so that the process list NVML returns is not empty. Prints the median and p99
of one `NVMLReader.read()` (off the critical path), of one `sample()` and of one full `Telemetry.sample()`
(CPU and GPU features: what a step's forecast reads), in microseconds.
"""
import argparse
import subprocess
import sys
import time

import numpy as np

COTENANT = ("import torch, time\nx = torch.randn(4096, 4096, device='cuda')\nend = time.time() + 120\n"
            "while time.time() < end:\n    x = (x @ x).clamp_(-1, 1)\n")


def _timed(fn, count):
    out = np.empty(count)
    for i in range(count):
        started = time.perf_counter()
        fn()
        out[i] = time.perf_counter() - started
    return 1e6 * out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reads", type=int, default=500)
    parser.add_argument("--cotenant", action="store_true")
    args = parser.parse_args(argv)
    if args.reads < 10:
        parser.error(f"--reads={args.reads} is not allowed: at least 10")
    from predictor.nvml import NVMLReader
    from predictor.telemetry import Telemetry

    cotenant = subprocess.Popen([sys.executable, "-c", COTENANT]) if args.cotenant else None
    try:
        if cotenant is not None:
            time.sleep(15)  # CUDA start-up of the co-tenant
        reader = NVMLReader(0)
        if not reader.available:
            print("NVML unavailable: nothing to measure")
            return 1
        names = ("procs", "other_mem", "sm_clock", "power", "cap", "slowdown", "mem")
        print(f"reading: {dict(zip(names, reader.read()))}")
        rows = {"NVMLReader.read (reader thread)": _timed(reader.read, args.reads),
                "NVMLReader.sample (critical path)": _timed(reader.sample, args.reads)}
        telemetry = Telemetry(gpu=reader.start())
        telemetry.sample()
        rows["Telemetry.sample, CPU + GPU (critical path)"] = _timed(telemetry.sample, args.reads)
        reader.close()
        telemetry = Telemetry()
        telemetry.sample()
        rows["Telemetry.sample, CPU only"] = _timed(telemetry.sample, args.reads)
        for name, us in rows.items():
            print(f"{name:<44} median {np.median(us):8.1f} us   p99 {np.percentile(us, 99):8.1f} us")
    finally:
        if cotenant is not None:
            cotenant.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
