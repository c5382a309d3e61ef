#!/usr/bin/env bash
# Container entrypoint. The first argument picks what the container does; the rest is passed through:
#   compare [ARGS]    python -m benchmarks.compare ARGS (the default: the static-4 comparison)
#   simulate [ARGS]   python -m benchmarks.simulate ARGS
#   worker [ARGS]     python -m benchmarks.worker ARGS (one rank; horovodrun starts these)
#   sshd              run sshd in the foreground: a worker container waiting for horovodrun
#   anything else     run it as a command (e.g. horovodrun ..., bash)
set -euo pipefail
cd "${LBBSP_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
python="${LBBSP_PYTHON_BIN:-python}"
what="${1:-compare}"
[ $# -gt 0 ] && shift
case "$what" in
  compare)  exec "$python" -m benchmarks.compare "$@" ;;
  simulate) exec "$python" -m benchmarks.simulate "$@" ;;
  worker)   exec "$python" -m benchmarks.worker "$@" ;;
  sshd)     exec /usr/sbin/sshd -D -e ;;
  *)        exec "$what" "$@" ;;
esac
