"""Speed predictors for LB-BSP: NARX (default) and the baselines, behind one interface.

`make_predictor("narx" | "arx" | "ema" | "last")` returns a fresh predictor;
a predictor instance is passed through. NARX and ARX load the models shipped
in `predictor/models/`; if that fails (missing or corrupt file) they fall back
to EMA with a warning, so a training job never stops for it.
"""
import logging

from .base import SpeedPredictor
from .baselines import EMAPredictor, LastValuePredictor

__all__ = ["SpeedPredictor", "EMAPredictor", "LastValuePredictor", "make_predictor", "PREDICTORS"]

log = logging.getLogger(__name__)

PREDICTORS = ("narx", "arx", "ema", "last")


def _learned(name):
    from . import narx  # numpy only; imported lazily to keep `import predictor` cheap

    try:
        return narx.load_default(name)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("predictor %r: could not load its shipped model (%s); using 'ema' instead", name, exc)
        return EMAPredictor()


def make_predictor(predictor="narx"):
    """A SpeedPredictor from an instance or one of the names in PREDICTORS."""
    if isinstance(predictor, SpeedPredictor):
        return predictor
    if predictor == "ema":
        return EMAPredictor()
    if predictor == "last":
        return LastValuePredictor()
    if predictor in ("narx", "arx"):
        return _learned(predictor)
    raise ValueError(f"predictor={predictor!r} is not allowed: give a SpeedPredictor or one of {list(PREDICTORS)}")
