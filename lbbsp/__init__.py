"""lbbsp: load-balanced BSP for Horovod.

The framework-free core (allocation, step-time model, policies, controller,
balancer, sharding, metrics) needs only numpy; the Keras/Horovod glue lives in
`lbbsp.keras`.
"""
from .allocation import Bounds, split
from .feed import BatchFeed
from .policies import POLICIES, make_policy
from .steptime import StepTimeModel, StepTimeParams

__version__ = "0.3.0"
__all__ = ["Bounds", "split", "BatchFeed", "StepTimeModel", "StepTimeParams", "POLICIES", "make_policy",
           "__version__"]
