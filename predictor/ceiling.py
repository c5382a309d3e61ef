"""How far the NARX model class gets on the held-out traces once it has seen them: a ceiling for its MAPE target.

    python -m predictor.ceiling                # the held-out recorded traces, first 60% of each seen in training
    python -m predictor.ceiling --head 0.5 --json out.json

The shipped models are scored against baselines on contention their training
traces did not have (predictor.evaluate). Whether a forecast can do better
there is a question about the model class and the noise, not only about
coverage. Two models are trained here exactly as predictor.train trains the
shipped ones (same candidates, selection, loss and early stopping), each
scored with predictor.evaluate's table:

- *forward*: the training traces plus the first `head` of every held-out
  trace, scored on the rest of each: the same contention kinds and the same
  traces, later steps, as if the machine had been recorded before. The
  shipped models are scored on the same steps beside it.
- *memorised*: the held-out traces themselves, scored on the same steps. It
  counts draws the model has learnt: an optimistic figure for a model of
  this size, not a forecast of unseen steps.

For each, the ratio the MAPE target is stated in (README, "Speed
predictor"): the better learned row (NARX, NARX + online) over the best
baseline (last, EMA, ARX, ARX + online), on all steps.
"""
import argparse
import json
import os
import sys
import tempfile

from .evaluate import evaluate, format_table
from .narx import save
from .traces import cut, read_trace, to_rows, write_trace
from .train import QUICK, test_traces, train, training_traces

__all__ = ["ratio_to_best_baseline", "ceiling", "main"]

LEARNED = ("narx", "narx+online")
BASELINES = ("last", "ema", "arx", "arx+online")
ROWS = BASELINES + LEARNED


def ratio_to_best_baseline(table, key="all"):
    """(best learned row, best baseline row, MAPE ratio of the two) of an evaluate() table."""
    ours = min(LEARNED, key=lambda n: table[n][key])
    best = min(BASELINES, key=lambda n: table[n][key])
    return ours, best, table[ours][key] / table[best][key]


def _split(paths, head, directory):
    """Write the first `head` and the rest of every trace under directory/head and directory/tail."""
    out = {"head": [], "tail": []}
    for path in paths:
        trace = read_trace(path)
        n = trace["speed"].size
        edge = int(round(n * head))
        for part, (start, stop) in (("head", (0, edge)), ("tail", (edge, n))):
            target = os.path.join(directory, part, os.path.basename(path))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            piece = cut(trace, start, stop)
            write_trace(target, to_rows(piece), piece["comments"])
            out[part].append(target)
    return out


def _trained(paths, directory, quick, epochs, seed):
    """Train NARX and ARX on `paths` as predictor.train does; write both into `directory`."""
    narx, arx, report = train(paths, seed=seed, **(QUICK if quick else {"epochs": epochs}))
    os.makedirs(directory, exist_ok=True)
    save(narx, os.path.join(directory, "narx_default.npz"), meta=report)
    save(arx, os.path.join(directory, "arx_default.npz"), meta=report)
    return directory


def ceiling(held, head=0.6, quick=False, epochs=60, seed=0, train_paths=None):
    """{setting: evaluate() table} for "shipped" and "forward" (on the tails) and "memorised" (on whole traces)."""
    if not 0 < head < 1:
        raise ValueError(f"head={head!r} is not allowed: it must be a fraction strictly between 0 and 1")
    if not held:
        raise ValueError("no held-out traces given")
    train_paths = training_traces() if train_paths is None else list(train_paths)
    with tempfile.TemporaryDirectory(prefix="lbbsp-ceiling-") as tmp:
        parts = _split(held, head, tmp)
        forward = _trained(train_paths + parts["head"], os.path.join(tmp, "forward"), quick, epochs, seed)
        memorised = _trained(list(held), os.path.join(tmp, "memorised"), quick, epochs, seed)
        return {"shipped": evaluate(parts["tail"], rows=ROWS)[0],
                "forward": evaluate(parts["tail"], rows=ROWS, model_dir=forward)[0],
                "memorised": evaluate(list(held), rows=ROWS, model_dir=memorised)[0]}


TITLES = {"shipped": "shipped models, on the last {tail:.0%} of each held-out trace",
          "forward": "trained with the first {head:.0%} of each held-out trace, on the last {tail:.0%}",
          "memorised": "trained on the held-out traces, on the same steps"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", type=float, default=0.6, help="fraction of each held-out trace seen in training")
    parser.add_argument("--traces", nargs="*", help="held-out trace files (default: the held-out recorded traces)")
    parser.add_argument("--quick", action="store_true", help="one small NARX and ARX, few epochs (for testing)")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the tables to this JSON file")
    args = parser.parse_args(argv)
    held = args.traces or test_traces()
    missing = [p for p in held if not os.path.exists(p)]
    if missing or not held:
        parser.error(f"trace files not found: {missing or 'none given'}")
    try:
        tables = ceiling(held, args.head, args.quick, args.epochs, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    for setting, table in tables.items():
        ours, best, ratio = ratio_to_best_baseline(table)
        print(f"\n{TITLES[setting].format(head=args.head, tail=1 - args.head)}: "
              f"{ours} / best baseline {best} = {ratio:.3f}")
        print(format_table(table))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(tables, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
