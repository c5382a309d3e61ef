#!/usr/bin/env bash
# Container entrypoint. The first argument picks what the container does; the rest is passed through:
#   compare [ARGS]    python -m benchmarks.compare ARGS (the default: the static-4 comparison)
#   simulate [ARGS]   python -m benchmarks.simulate ARGS
#   worker [ARGS]     python -m benchmarks.worker ARGS (one rank; horovodrun starts these)
#   sshd              run sshd in the foreground: a worker container waiting for horovodrun
#   anything else     run it as a command (e.g. horovodrun ..., bash, pytest)
# Set up at start, as root, from the environment:
#   LBBSP_KEYS=DIR        a volume shared by the cluster's containers: the first container makes the
#                         cluster's ssh key there; every container trusts it (user lbbsp only)
#   LBBSP_USER=NAME       drop to this user before running the command (not for sshd)
#   LBBSP_RESULTS=DIR     made and given to LBBSP_USER (a mounted results directory)
#   LBBSP_WAIT_HOSTS="A B"  wait (up to LBBSP_WAIT_S, default 120 s) until ssh reaches every host
set -euo pipefail
home="${LBBSP_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$home"
what="${1:-compare}"
[ $# -gt 0 ] && shift
user="${LBBSP_USER:-}"

cluster_key() {
  local keys="$1" ssh=/home/lbbsp/.ssh
  mkdir -p "$keys" && chmod 700 "$keys"
  # Containers start together: one makes the key, the others wait on the lock and reuse it.
  flock "$keys/.lock" bash -c "[ -f '$keys/id_ed25519' ] || ssh-keygen -q -t ed25519 -N '' -C lbbsp-cluster -f '$keys/id_ed25519'"
  install -d -m 700 -o lbbsp -g lbbsp "$ssh"
  install -m 600 -o lbbsp -g lbbsp "$keys/id_ed25519" "$ssh/id_ed25519"
  install -m 600 -o lbbsp -g lbbsp "$keys/id_ed25519.pub" "$ssh/authorized_keys"
  install -m 600 -o lbbsp -g lbbsp "$home/docker/ssh_config" "$ssh/config"
}

wait_hosts() {
  local deadline=$(( SECONDS + ${LBBSP_WAIT_S:-120} )) host
  for host in $1; do
    until ssh -o BatchMode=yes -o ConnectTimeout=2 "$host" true 2>/dev/null; do
      if [ "$SECONDS" -ge "$deadline" ]; then
        echo "entrypoint: ssh to $host failed for ${LBBSP_WAIT_S:-120} s; is its container running 'sshd'?" >&2
        exit 1
      fi
      sleep 1
    done
  done
}

if [ "$(id -u)" = 0 ]; then
  [ -n "${LBBSP_KEYS:-}" ] && cluster_key "$LBBSP_KEYS"
  if [ "$what" = sshd ]; then
    ssh-keygen -A >/dev/null
    exec /usr/sbin/sshd -D -e
  fi
  if [ -n "$user" ]; then
    [ -n "${LBBSP_RESULTS:-}" ] && install -d -o "$user" -g "$user" "$LBBSP_RESULTS"
    export HOME="/home/$user" USER="$user" LOGNAME="$user"
    exec setpriv --reuid="$user" --regid="$user" --init-groups -- "$0" "$what" "$@"
  fi
elif [ "$what" = sshd ]; then
  echo "entrypoint: sshd needs root (it serves the training user's logins)" >&2
  exit 2
fi

[ -n "${LBBSP_WAIT_HOSTS:-}" ] && wait_hosts "$LBBSP_WAIT_HOSTS"
python="${LBBSP_PYTHON_BIN:-python}"
case "$what" in
  compare)  exec "$python" -m benchmarks.compare "$@" ;;
  simulate) exec "$python" -m benchmarks.simulate "$@" ;;
  worker)   exec "$python" -m benchmarks.worker "$@" ;;
  *)        exec "$what" "$@" ;;
esac
