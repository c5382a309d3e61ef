"""Packaging for lbbsp (the Horovod plugin) and predictor (the NARX speed predictor)."""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def _requirements(name):
    lines = (HERE / "requirements" / name).read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


setup(
    name="lbbsp",
    version="0.2.0",
    description="Load-balanced BSP for Horovod Keras: per-worker batch sizes from predicted speeds",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9,<3.12",
    packages=find_packages(include=["lbbsp", "lbbsp.*", "predictor", "predictor.*"]),
    package_data={"predictor": ["models/*.npz", "data/traces/*.csv.gz"]},
    install_requires=[r for r in _requirements("runtime.txt") if not r.startswith("tensorflow")],
    extras_require={"dev": _requirements("dev.txt")},
)
