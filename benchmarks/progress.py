"""Progress of long benchmark runs: a live bar on a terminal, one line per finished unit in a log."""
import sys
import time

__all__ = ["Progress"]


class Progress:
    """`total` units (e.g. variant runs) of `parts` parts each (e.g. epochs)."""

    def __init__(self, total, parts=1, stream=None):
        self.total, self.parts = int(total), max(int(parts), 1)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.done = 0
        self.start = time.monotonic()
        self._last = None

    def _eta(self, fraction):
        elapsed = time.monotonic() - self.start
        return elapsed, (elapsed / fraction * (1 - fraction) if fraction > 0 else float("nan"))

    def update(self, label, parts_done=0):
        """The unit `label` has finished `parts_done` of its parts (redraws the bar on a terminal only)."""
        if not self.tty:
            return
        fraction = (self.done + min(parts_done, self.parts) / self.parts) / self.total
        elapsed, eta = self._eta(fraction)
        fill = int(30 * fraction)
        eta_text = f"eta {eta:5.0f}s" if eta == eta else "eta     ?"
        line = (f"[{'#' * fill}{'.' * (30 - fill)}] {self.done}/{self.total}  {label:<18} "
                f"elapsed {elapsed:5.0f}s  {eta_text}")
        if line != self._last:
            self._last = line
            self.stream.write("\r" + line)
            self.stream.flush()

    def finished(self, label, result=""):
        """One unit is done: a line in a log, the bar moves on a terminal."""
        self.done += 1
        elapsed, eta = self._eta(self.done / self.total)
        line = f"{self.done}/{self.total} {label} {result} (elapsed {elapsed:.0f}s, eta {eta:.0f}s)"
        self.stream.write(("\r" + " " * 100 + "\r" + line + "\n") if self.tty else line + "\n")
        self.stream.flush()
