"""Small helpers the framework-free tests share."""
import numpy as np

from lbbsp.allocation import Bounds, sanitize, split
from lbbsp.controller import Plan


def proportional(speeds, total, b_min=1):
    """Integer batches proportional to `speeds`, as a policy without fixed costs splits."""
    v = sanitize(speeds, 1.0)
    return split(int(total), Bounds.of(v.size, int(total), b_min), v, np.zeros(v.size), np.zeros(v.size))


def plan(feed, epoch, step, sizes):
    """Publish a step's split to `feed`, as the balancer does with a decided Plan."""
    sizes = np.asarray(sizes, dtype=np.int64)
    feed.publish(Plan(int(epoch), int(step), sizes, np.zeros(sizes.size)))
