#!/usr/bin/env bash
# Create or refresh the project's virtual environment: TensorFlow 2.15.1,
# Horovod 0.28.1 built from source (Gloo on CPU, NCCL with --gpu) and lbbsp.
# Idempotent: a stamp holding the hash of every input makes a second run
# return at once. Usage: scripts/bootstrap.sh [--gpu] [--no-dev] [--venv DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LBBSP_VENV:-$root/.venv}"
gpu=0
dev=1
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu=1 ;;
    --no-dev) dev=0 ;;
    --venv) venv="$2"; shift ;;
    *) echo "bootstrap.sh: unknown option '$1' (allowed: --gpu, --no-dev, --venv DIR)" >&2; exit 2 ;;
  esac
  shift
done
python="${LBBSP_PYTHON:-python3.11}"
command -v "$python" >/dev/null || { echo "bootstrap.sh: $python not found; Python 3.11 is required" >&2; exit 2; }

stamp="$venv/.lbbsp-bootstrap"
want="$( { cat "$root"/requirements/*.txt "$root/setup.py" "$0" "$root/scripts/build_horovod.sh"; echo "gpu=$gpu dev=$dev"; } | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

echo "bootstrap: building $venv (first run compiles Horovod: about 6 minutes on 2 cores)" >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip setuptools wheel
runtime=("-r" "$root/requirements/runtime.txt")
if [ "$gpu" = 1 ]; then
  # Same pins, but the CUDA build of TensorFlow.
  sed 's/^tensorflow-cpu==/tensorflow==/' "$root/requirements/runtime.txt" > "$venv/runtime-gpu.txt"
  runtime=("-r" "$venv/runtime-gpu.txt")
fi
"${pip[@]}" install "${runtime[@]}"

# Horovod from source against the TensorFlow just installed (Gloo; NCCL and MPI with --gpu); pip's wheel
# cache stays on, so a rebuild of the venv reuses the compiled Horovod.
bash "$root/scripts/build_horovod.sh" "$venv/bin/python" $([ "$gpu" = 1 ] && echo --gpu)
if [ "$dev" = 1 ]; then
  "${pip[@]}" install -r "$root/requirements/dev.txt"
fi
"${pip[@]}" install --no-deps --no-build-isolation -e "$root"
echo "$want" > "$stamp"
echo "bootstrap: ready ($venv)" >&2
