"""Speed predictors for LB-BSP: NARX (default) and the baselines, behind one interface.

`make_predictor("narx" | "arx" | "ema" | "last", device="cpu" | "gpu")` returns a fresh predictor;
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


DEVICES = ("cpu", "gpu")


def _learned(name, device):
    from . import narx  # numpy only; imported lazily to keep `import predictor` cheap

    try:
        return narx.load_default(name, device=device)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("predictor %r: could not load its shipped %s model (%s); using 'ema' instead", name, device, exc)
        return EMAPredictor()


def make_predictor(predictor="narx", device="cpu"):
    """A SpeedPredictor from an instance or one of the names in PREDICTORS; NARX and ARX load the model shipped
    for `device` ("cpu": trained on CPU and memory readings; "gpu": on a GPU's, predictor.nvml)."""
    if isinstance(predictor, SpeedPredictor):
        return predictor
    if device not in DEVICES:
        raise ValueError(f"device={device!r} is not allowed: give one of {list(DEVICES)}")
    if predictor == "ema":
        return EMAPredictor()
    if predictor == "last":
        return LastValuePredictor()
    if predictor in ("narx", "arx"):
        return _learned(predictor, device)
    raise ValueError(f"predictor={predictor!r} is not allowed: give a SpeedPredictor or one of {list(PREDICTORS)}")
