"""Which Keras lbbsp.keras runs on: Keras 2, as Horovod's Keras layer needs.

TensorFlow 2.15 and earlier ship Keras 2 as tf.keras. From 2.16, tf.keras is
Keras 3 unless the tf-keras package of the same minor version is installed
and TF_USE_LEGACY_KERAS=1 is set before TensorFlow is imported; Horovod 0.28.1
does not work with Keras 3, and neither does lbbsp.
"""

__all__ = ["check_keras"]


def check_keras(tf):
    """Raise ImportError naming the fix when `tf` (the tensorflow module) runs Keras 3."""
    version = str(getattr(tf.keras, "__version__", "2"))
    if int(version.split(".")[0]) < 3:
        return version
    minor = ".".join(str(tf.__version__).split(".")[:2])
    raise ImportError(
        f"lbbsp.keras needs Keras 2, but TensorFlow {tf.__version__} runs Keras {version} as tf.keras (Horovod's "
        f"Keras layer does not support Keras 3 either). Install the Keras 2 package of the same minor version, "
        f"pip install 'tf-keras=={minor}.*', and set TF_USE_LEGACY_KERAS=1 in the environment before TensorFlow "
        "is imported (horovodrun -x TF_USE_LEGACY_KERAS=1 ... passes it to every worker).")
