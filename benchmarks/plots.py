"""PNG plots of a comparison: per-worker batch sizes over time (first round), epoch time per variant over rounds."""
import csv
import glob
import os

import numpy as np

__all__ = ["plot_all"]


def _steps(run_dir):
    """{rank: {"batch": array, "step_time": array, "time": array}} from a run's per-rank CSVs."""
    out = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "steps_rank*.csv"))):
        rank = int(os.path.basename(path)[len("steps_rank"):-4])
        with open(path) as fh:
            rows = list(csv.DictReader(fh))
        out[rank] = {k: np.array([float(r[k]) for r in rows]) for k in ("batch_size", "step_time", "time")}
    return out


def plot_all(out_dir, results):
    """Write the plots of a comparison (`results`: label -> list of run summaries); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    dynamic = [v for v in results if v not in ("horovod", "equal") and _steps(os.path.join(out_dir, v, "r0"))]
    if dynamic:
        fig, axes = plt.subplots(len(dynamic), 1, figsize=(9, 2.2 * len(dynamic)), sharex=True, squeeze=False)
        for ax, label in zip(axes[:, 0], dynamic):
            steps = _steps(os.path.join(out_dir, label, "r0"))
            t0 = min(s["time"][0] for s in steps.values())
            for rank, s in sorted(steps.items()):
                ax.plot(s["time"] - t0, s["batch_size"], label=f"worker {rank}", lw=1)
            ax.set_ylabel("batch")
            ax.set_title(label, fontsize=9, loc="left")
        axes[0, 0].legend(fontsize=7, ncol=4, loc="upper right")
        axes[-1, 0].set_xlabel("seconds since training start")
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "batches_over_time.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    labels = list(results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.4))
    ax1.boxplot([[r["epoch_time"] for r in results[v]] for v in labels], showfliers=False)
    ax1.set_xticks(range(1, len(labels) + 1), labels)
    ax1.set_ylabel("epoch time (s)")
    ax1.tick_params(axis="x", rotation=30, labelsize=8)
    ax1.set_title("epoch time over the rounds", fontsize=9)
    measured = [v for v in labels if all(r.get("idle_fraction") is not None for r in results[v])]
    ax2.bar(measured, [100 * float(np.median([r["idle_fraction"] for r in results[v]])) for v in measured],
            color="tab:orange")
    ax2.set_ylabel("idle fraction (%)")
    ax2.tick_params(axis="x", rotation=30, labelsize=8)
    ax2.set_title("time blocked in the allreduce / wall time", fontsize=9)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "epoch_time_and_idle.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def plot_scaling(path, etas, title=""):
    """Efficiency against cluster size: `etas` maps (workers, profile, policy) to eta; one panel per profile."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = sorted({profile for _, profile, _ in etas})
    policies = list(dict.fromkeys(policy for _, _, policy in etas))
    fig, axes = plt.subplots(1, len(profiles), figsize=(5.5 * len(profiles) + 1.8, 4), squeeze=False, sharey=True)
    colors = plt.get_cmap("tab20").colors  # one colour per policy: the default cycle repeats after ten
    for ax, profile in zip(axes[0], profiles):
        for i, policy in enumerate(policies):
            sizes = sorted(n for n, p, name in etas if p == profile and name == policy)
            style = "--" if "oracle" in policy else "-"
            ax.plot(sizes, [etas[(n, profile, policy)] for n in sizes], style, marker="o", label=policy,
                    color=colors[2 * i % 20 + i // 10 % 2])  # the dark shades, then the light
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.set_title(f"{profile} {title}".strip())
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("eta (best split's step / step taken)")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
