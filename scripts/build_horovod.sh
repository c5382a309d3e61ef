#!/usr/bin/env bash
# Build and install Horovod (the version in requirements/horovod.txt, 0.28.1) from source against the
# TensorFlow installed in a Python environment.
#
#   bash scripts/build_horovod.sh PYTHON [--gpu]
#
# PYTHON is that environment's interpreter (e.g. .venv/bin/python). With TensorFlow 2.15 or older the release
# builds as it is (pip's wheel cache keeps the compiled wheel). From 2.16 on, Horovod 0.28.1's
# horovod/tensorflow/xla_mpi_ops.cc includes XLA headers that TensorFlow's wheels no longer ship usably, so its
# body is compiled out there: its `#if TENSORFLOW_VERSION >= 2006000000` guard gets an upper bound of 2.16
# (upstream's fix is the open pull request horovod/horovod#4302). Those XLA ops are only used when
# HOROVOD_ENABLE_XLA_OPS is set; Horovod's TensorFlow and Keras layers do not need them. The patched build is
# kept in ~/.cache/lbbsp-horovod/, one wheel per TensorFlow version. Gloo only; --gpu adds NCCL and MPI.
set -euo pipefail
python="${1:?usage: build_horovod.sh PYTHON [--gpu]}"
gpu="${2:-}"
version="$(sed -n 's/^horovod==//p' "$(dirname "${BASH_SOURCE[0]}")/../requirements/horovod.txt")"
pip=("$python" -m pip --disable-pip-version-check -q)
tf="$("$python" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)" || {
  echo "build_horovod.sh: TensorFlow is not importable from $python; install it first" >&2; exit 2; }
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1
if [ "$gpu" = --gpu ]; then
  export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_WITH_MPI=1
else
  export HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO
fi
export MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}"
major_minor="$(echo "$tf" | cut -d. -f1,2)"
if [ "$(printf '%s\n2.16\n' "$major_minor" | sort -V | head -n1)" != 2.16 ]; then
  # TensorFlow 2.15 or older: the release as it is.
  "${pip[@]}" install --no-build-isolation "horovod==$version"
  exit 0
fi
cache="${LBBSP_HOROVOD_CACHE:-$HOME/.cache/lbbsp-horovod}/tf$tf${gpu:+-gpu}"
wheel="$(ls "$cache"/horovod-$version-*.whl 2>/dev/null | head -n1 || true)"
if [ -z "$wheel" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  "${pip[@]}" download --no-deps --no-binary :all: --no-build-isolation -d "$work" "horovod==$version"
  tar -xzf "$work"/horovod-$version.tar.gz -C "$work"
  source="$work/horovod-$version/horovod/tensorflow/xla_mpi_ops.cc"
  grep -q '^#if TENSORFLOW_VERSION >= 2006000000$' "$source" || {
    echo "build_horovod.sh: $source has not the guard this patch expects" >&2; exit 1; }
  sed -i 's/^#if TENSORFLOW_VERSION >= 2006000000$/#if TENSORFLOW_VERSION >= 2006000000 \&\& TENSORFLOW_VERSION < 2016000000/' \
    "$source"
  echo "build_horovod.sh: TensorFlow $tf: patched horovod/tensorflow/xla_mpi_ops.cc (its XLA ops compiled out, as" \
       "horovod/horovod#4302 does); building Horovod $version" >&2
  mkdir -p "$cache"
  "${pip[@]}" wheel --no-deps --no-build-isolation -w "$cache" "$work/horovod-$version"
  wheel="$(ls "$cache"/horovod-$version-*.whl | head -n1)"
fi
"${pip[@]}" install --no-deps --force-reinstall "$wheel"
# Horovod's own requirements (the wheel was installed without them).
"${pip[@]}" install cloudpickle psutil pyyaml packaging
