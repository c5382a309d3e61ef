"""lbbsp: load-balanced BSP for Horovod.

The framework-free core (allocation, step-time model, sharding, policies,
controller, metrics) needs only numpy; the Keras/Horovod glue lives in
`lbbsp.keras`.
"""
from .allocation import Rebalancer, allocate
from .feed import BatchFeed
from .policies import POLICIES, make_policy
from .steptime import StepTimeModel

__version__ = "0.2.0"
__all__ = ["allocate", "Rebalancer", "BatchFeed", "StepTimeModel", "POLICIES", "make_policy", "__version__"]
