#!/usr/bin/env bash
# End to end with containers: build the CPU image, run the unit tests inside it, start the compose
# cluster (four CPU-limited workers and a launcher) and collect the comparison against plain Horovod
# under results/compose/ on this host. Works with `docker compose` (v2) and `docker-compose` (1.29).
#
#   docker/smoke.sh                         # everything; about 35 min from cold on 2 cores
#   LBBSP_REPEATS=1 docker/smoke.sh         # one round per policy (a quicker, noisier table)
#
# Environment: BASE_IMAGE (default: the official Python image if it can be had, else one made here
# by docker/make-base.sh), LBBSP_VARIANTS, LBBSP_REPEATS, LBBSP_CPU_FULL/HALF/QUARTER (see
# compose.yml), PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_TRUSTED_HOST (forwarded to the build's
# dependency stage; by default taken from this host's pip configuration where they are http(s) URLs),
# PIP_CA_PEM (extra CA certificates for pip's TLS; default: this host's /usr/local/share/ca-certificates).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out=results/compose
image="${LBBSP_IMAGE:-lbbsp:cpu}"
project=lbbsp-smoke
die() { echo "smoke.sh: $*" >&2; exit 2; }
say() { echo "smoke.sh: $*" >&2; }

command -v docker >/dev/null || die "no docker command: install a Docker engine (e.g. apt-get install docker.io)"
docker info >/dev/null 2>&1 || die "no Docker engine is running ('docker info' failed): start one \
(as root: dockerd --storage-driver=vfs, or systemctl start docker) and run this again"
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v docker-compose >/dev/null; then
  compose=(docker-compose)
else
  die "neither 'docker compose' (v2) nor 'docker-compose' (1.29) is installed"
fi
mkdir -p "$out"
timings="$out/timings.txt"
: > "$timings"
timed() {  # timed NAME CMD...: run CMD, log its output, record its wall time
  local name="$1" start=$SECONDS
  shift
  say "$name ..."
  if ! "$@" > "$out/$name.log" 2>&1; then
    tail -n 40 "$out/$name.log" >&2
    die "$name failed; full log: $out/$name.log"
  fi
  echo "$name $(( SECONDS - start )) s" | tee -a "$timings" >&2
}

base="${BASE_IMAGE:-}"
if [ -z "$base" ]; then
  base=python:3.11.9-slim-bookworm
  if ! docker image inspect "$base" >/dev/null 2>&1 && ! timeout 120 docker pull -q "$base" >/dev/null 2>&1; then
    say "$base cannot be pulled here: making a Debian base with debootstrap instead"
    base=lbbsp-base:bookworm
    docker image inspect "$base" >/dev/null 2>&1 || timed base bash docker/make-base.sh "$base"
  fi
fi

pip_setting() {  # the host's value of a pip option, from the environment or pip's configuration
  local env="$1" key="$2" value="${!1:-}"
  [ -n "$value" ] || value="$(python3 -m pip config list 2>/dev/null | sed -n "s/^[a-z:.]*\.$key='\(.*\)'$/\1/p" | head -n 1)"
  # Only network indexes: a file:// path on this host does not exist inside the build.
  tr ' ' '\n' <<<"$value" | grep -E '^https?://|^[A-Za-z0-9.-]+$' | paste -sd ' ' - || true
}
build_args=(--build-arg "BASE_IMAGE=$base")
for pair in PIP_INDEX_URL:index-url PIP_EXTRA_INDEX_URL:extra-index-url PIP_TRUSTED_HOST:trusted-host; do
  value="$(pip_setting "${pair%%:*}" "${pair#*:}")"
  [ -n "$value" ] && build_args+=(--build-arg "${pair%%:*}=$value")
done
# Site CA certificates (Debian keeps them in /usr/local/share/ca-certificates), for pip's TLS in the build.
ca_pem="${PIP_CA_PEM:-$(cat /usr/local/share/ca-certificates/*.crt 2>/dev/null || true)}"
[ -n "$ca_pem" ] && build_args+=(--build-arg "PIP_CA_PEM=$ca_pem")
timed build docker build --network host "${build_args[@]}" -f docker/Dockerfile.cpu -t "$image" .
say "image $image: $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.2f GB", $1 / 1e9}')"

timed unit-tests docker run --rm "$image" python -m pytest -q -p no:cacheprovider tests \
  --ignore=tests/test_multiprocess.py --ignore=tests/test_docker.py

cleanup() { "${compose[@]}" -f docker/compose.yml -p "$project" down -v >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
export BASE_IMAGE="$base" LBBSP_IMAGE="$image"
# Creating a container of a multi-GB image takes minutes with the vfs storage driver.
export COMPOSE_HTTP_TIMEOUT="${COMPOSE_HTTP_TIMEOUT:-900}"
timed compose "${compose[@]}" -f docker/compose.yml -p "$project" up --no-build \
  --abort-on-container-exit --exit-code-from launcher
table="$out/static-4/table.md"
[ -f "$table" ] || die "the compose run finished without $table; see $out/compose.log"
cat "$table"
say "done: $table, plots and per-run logs under $out/static-4/, step timings in $timings"
