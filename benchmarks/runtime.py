"""Start-up shared by every Horovod worker process of the benchmarks and the multi-process tests."""
import os

__all__ = ["init_worker"]


def init_worker(pin=True):
    """One TensorFlow thread per pool (several workers share a small machine), Horovod up, pinned to a core.

    Returns (horovod.tensorflow.keras, tensorflow). With `pin`, rank r is
    pinned to core r mod (cores this process may use).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow.keras as hvd

    hvd.init()
    if pin:
        from .contention import pin_to_cores

        cores = sorted(os.sched_getaffinity(0))
        pin_to_cores([cores[hvd.rank() % len(cores)]])
    return hvd, tf
