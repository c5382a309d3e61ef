"""Models and built-in data for the benchmarks and the trace recorder (no downloads).

- "mlp": a synthetic throughput workload in the style of Horovod's synthetic
  benchmark (random inputs and labels, a dense network): a large gradient,
  so the allreduce is a big part of a CPU step.
- "conv": shaped like GPU training, where compute dominates: heavy
  convolutions on 24x24 images with few parameters (about 14k, a 56 kB
  gradient). Images are class templates plus noise, so accuracy is
  meaningful.
- "images": the conv model fed from image files: the conv workload's
  samples written as 28x28 PNG files at set-up (generated, no downloads),
  then read, decoded, randomly cropped to 24x24 and flipped per sample in
  tf.data (`image_files`, `image_loader`): a job whose input pipeline costs
  real time.
- "cnn": scikit-learn's handwritten digits (1,797 real 8x8 images that ship
  inside the scikit-learn package) scaled up 3x in the model, so that
  compute dominates the step: real data, for accuracy.
"""
import os

import numpy as np

__all__ = ["WORKLOADS", "load_data", "build_model", "image_files", "image_loader"]

WORKLOADS = ("mlp", "conv", "images", "cnn")


def _check(name):
    if name not in WORKLOADS:
        raise ValueError(f"workload={name!r} is not allowed: use one of {list(WORKLOADS)}")


def load_data(name, seed=0, num_samples=8192, width=64):
    """(x_train, y_train, x_test, y_test) for a workload."""
    _check(name)
    if name == "mlp":
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(num_samples, width)).astype(np.float32)
        y = rng.integers(0, 10, size=num_samples).astype(np.int64)
        return x, y, x[:512], y[:512]
    if name in ("conv", "images"):
        side = 24 if name == "conv" else 28
        rng = np.random.default_rng(seed)
        templates = rng.normal(size=(10, side, side, 3)).astype(np.float32)
        total = num_samples + 512
        y = rng.integers(0, 10, size=total).astype(np.int64)
        x = (templates[y] + 2.0 * rng.normal(size=(total, side, side, 3))).astype(np.float32)
        return x[:num_samples], y[:num_samples], x[num_samples:], y[num_samples:]
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise ImportError("workload 'cnn' needs scikit-learn (pip install -r requirements/dev.txt)") from exc
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = 1437
    return x[:split], y[:split], x[split:], y[split:]


def build_model(name, hidden=512, width=64, seed=0):
    """A compiled-later Keras model for a workload (the caller compiles it with its optimizer)."""
    import tensorflow as tf

    _check(name)
    tf.keras.utils.set_random_seed(seed)
    layers = tf.keras.layers
    if name == "mlp":
        return tf.keras.Sequential([
            layers.Dense(hidden, activation="relu", input_shape=(width,)),
            layers.Dense(hidden, activation="relu"),
            layers.Dense(10),
        ])
    if name in ("conv", "images"):
        return tf.keras.Sequential([
            layers.Conv2D(16, 3, padding="same", activation="relu", input_shape=(24, 24, 3)),
            layers.Conv2D(24, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(2),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dense(10),
        ])
    return tf.keras.Sequential([  # the digits scaled up 3x: compute dominates the step, as on GPUs
        layers.UpSampling2D(3, interpolation="bilinear", input_shape=(8, 8, 1)),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(6),
        layers.Flatten(),
        layers.Dense(128, activation="relu"),
        layers.Dense(10),
    ])


def image_files(x, directory):
    """Write images x (n, h, w, 3, roughly standard normal) as PNG files under `directory`; return their paths.

    Files already there are kept, and each is written under a temporary name
    and renamed, so several processes may call this at once.
    """
    import tensorflow as tf

    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"{i:06d}.png") for i in range(len(x))]
    pixels = np.clip(x * 40.0 + 128.0, 0, 255).astype(np.uint8)
    for i, path in enumerate(paths):
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            tf.io.write_file(tmp, tf.io.encode_png(pixels[i]))
            os.replace(tmp, path)
    return paths


def image_loader(paths, labels, crop=24, seed=0):
    """`load(index)` for tf.data: read the file, decode it, random crop to `crop` x `crop`, random flip."""
    import tensorflow as tf

    files = tf.constant(paths)
    targets = tf.constant(np.asarray(labels, dtype=np.int64))

    def load(index):
        image = tf.io.decode_png(tf.io.read_file(tf.gather(files, index)), channels=3)
        image = (tf.cast(image, tf.float32) - 128.0) / 40.0
        image = tf.image.random_crop(image, [crop, crop, 3], seed=seed)
        image = tf.image.random_flip_left_right(image, seed=seed)
        return image, tf.gather(targets, index)

    return load
