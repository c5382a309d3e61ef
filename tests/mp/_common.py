"""Shared start-up of the multi-process test workers: one thread per worker, quiet TensorFlow, Horovod up."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def init_worker():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow.keras as hvd

    hvd.init()
    return hvd, tf
