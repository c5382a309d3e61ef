"""Per-step records of one rank with flat memory: rows stream to a CSV, epoch figures are running sums.

A job of a million steps keeps at most `keep` rows in memory (for
inspection and tests) and a few sums per epoch, whatever its length.
"""
import collections
import csv
import logging
import math

from .checks import integer

__all__ = ["StepLog", "FIELDS"]

log = logging.getLogger(__name__)

#: Columns of the per-step CSV (telemetry features follow where they were read).
FIELDS = (
    "time", "epoch", "step", "rank", "workers", "global_batch", "batch_size", "compute", "wait", "step_time",
    "speed", "offset", "forecast", "next_batch_size", "efficiency", "overhead", "overhead_cpu", "background",
    "decision",
)


class StepLog:
    """Rows of FIELDS (plus `extra` columns) for one rank; see the module docstring.

    A `path` that cannot be opened is a ValueError at once (before training); a write that fails later (a full
    disk) stops the CSV with one warning, and training and the in-memory rows go on.
    """

    def __init__(self, path=None, keep=1000, extra=(), append=False):
        self.path, self.columns = path, FIELDS + tuple(extra)
        self.rows = collections.deque(maxlen=integer("keep", keep, 0, optional=True, what=" (None: keep every row)"))
        self._fh = self._writer = None
        self.steps = 0
        self._reset_epoch()
        if path:
            try:
                self._fh = open(path, "a" if append else "w", newline="")
                self._writer = csv.DictWriter(self._fh, fieldnames=self.columns, extrasaction="ignore")
                if self._fh.tell() == 0:
                    self._writer.writeheader()
            except OSError as exc:
                self.close()
                raise ValueError(f"csv_path={str(path)!r} is not allowed: {exc.strerror or exc}; give a file in an "
                                 "existing folder this process may write to") from exc

    def _reset_epoch(self):
        self._n = 0
        self._sums = collections.Counter()
        self._eff = [0.0, 0.0]

    def add(self, row, balanced=None, slowest=None):
        """Record one step; `balanced` and `slowest` (seconds) feed the epoch's efficiency when known."""
        if self._writer is not None:
            self._guarded(self._writer.writerow, row)
        self.rows.append(row)
        self.steps += 1
        self._n += 1
        for key in ("batch_size", "wait", "step_time", "overhead", "overhead_cpu", "background"):
            value = row.get(key, math.nan)
            if math.isfinite(value):
                self._sums[key] += value
        if balanced is not None and slowest is not None and math.isfinite(balanced) and slowest > 0:
            self._eff[0] += balanced
            self._eff[1] += slowest

    def epoch_summary(self):
        """Figures over the rows added since the last call (then reset): mean batch, idle fraction, ..."""
        out = {}
        if self._n:
            s = self._sums
            out["lbbsp_batch"] = s["batch_size"] / self._n
            out["lbbsp_idle_fraction"] = s["wait"] / s["step_time"] if s["step_time"] > 0 else 0.0
            out["lbbsp_overhead_ms"] = 1e3 * s["overhead"] / self._n
            out["lbbsp_overhead_cpu_ms"] = 1e3 * s["overhead_cpu"] / self._n
            out["lbbsp_background_ms"] = 1e3 * s["background"] / self._n
        if self._eff[1] > 0:
            out["lbbsp_efficiency"] = self._eff[0] / self._eff[1]
        self._reset_epoch()
        return out

    def _guarded(self, write, *args):
        try:
            write(*args)
        except OSError as exc:
            log.warning("lbbsp: writing the step log %s failed (%r); it gets no more rows (training goes on, and the "
                        "latest rows stay in `history`)", self.path, exc)
            self.close()

    def flush(self):
        if self._fh is not None:
            self._guarded(self._fh.flush)

    def close(self):
        fh, self._fh, self._writer = self._fh, None, None
        if fh is not None:
            try:
                fh.close()
            except OSError:  # the data it still held could not be written: warned where a write failed
                pass
