"""lbbsp: load-balanced BSP for Horovod.

The framework-free core (allocation, sharding, policies, controller, metrics)
imports only numpy; the Keras/Horovod glue lives in `lbbsp.keras`.
"""
from .allocation import Rebalancer, allocate
from .feed import BalancedFeed
from .policies import POLICIES, make_policy

__version__ = "0.1.0"
__all__ = ["allocate", "Rebalancer", "BalancedFeed", "POLICIES", "make_policy", "__version__"]
