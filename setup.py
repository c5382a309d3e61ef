"""Packaging for lbbsp (the Horovod plugin) and predictor (the NARX speed predictor).

TensorFlow (tensorflow or tensorflow-cpu; with tf-keras on 2.16 and later) and Horovod are prerequisites the
user brings: their CPU and GPU builds differ, and Horovod is compiled against the TensorFlow installed
(README, "Install"). The exact pins of the project's own benchmark environment live in requirements/.
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "lbbsp" / "__init__.py").read_text()).group(1)

setup(
    name="lbbsp",
    version=VERSION,
    description="Load-balanced BSP for Horovod Keras: per-worker batch sizes from predicted speeds",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11,<3.12",  # the only version tested (scripts/compat.sh, CI)
    packages=find_packages(include=["lbbsp", "lbbsp.*", "predictor", "predictor.*"]),
    package_data={"predictor": ["models/*.npz", "data/traces/*.csv.gz"]},
    install_requires=["numpy>=1.23,<3", "psutil>=5.9"],
    extras_require={"gpu": ["nvidia-ml-py>=11.5"]},
    classifiers=["Programming Language :: Python :: 3.11",
                 "Topic :: Scientific/Engineering :: Artificial Intelligence"],
)
