#!/usr/bin/env bash
# Build a Debian bookworm base image with debootstrap, for machines that cannot pull one from a
# registry (air-gapped clusters). It holds what the lbbsp images need from the system: Python 3.11
# with venv and headers, a C++ toolchain and cmake (Horovod compiles inside the build), ssh, procps.
# The Debian mirror is the one this machine's apt already uses (override with MIRROR=...).
#
#   sudo docker/make-base.sh [TAG]        # default tag: lbbsp-base:bookworm
#   docker build --build-arg BASE_IMAGE=lbbsp-base:bookworm -f docker/Dockerfile.cpu -t lbbsp:cpu .
set -euo pipefail
tag="${1:-lbbsp-base:bookworm}"
suite=bookworm
packages=python3,python3-venv,python3-dev,build-essential,cmake,openssh-client,openssh-server,ca-certificates,procps

die() { echo "make-base.sh: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "debootstrap needs root (run it with sudo)"
command -v debootstrap >/dev/null || die "debootstrap not found: apt-get install debootstrap"
docker info >/dev/null 2>&1 || die "no Docker engine answers 'docker info': start dockerd first"

host_mirror() {
  # The first http(s) URI of a Debian (not security) source, deb822 or one-line format.
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}'
  } | grep -E '^https?://' | grep -v -- '-security' | head -n 1 || true
}
mirror="${MIRROR:-$(host_mirror)}"
[ -n "$mirror" ] || die "no Debian mirror found in /etc/apt; set MIRROR=http://<your mirror>/debian"

rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT
chmod 755 "$rootfs"  # it becomes the image's /: mktemp's 0700 would lock every non-root user out
echo "make-base.sh: debootstrap $suite from the host's mirror into $rootfs" >&2
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >&2
# Host keys made by openssh-server's install would be shared by every image built on this base:
# the lbbsp entrypoint makes them when a container starts.
rm -f "$rootfs"/etc/ssh/ssh_host_* "$rootfs"/var/cache/apt/archives/*.deb
rm -rf "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
  -c 'CMD ["bash"]' - "$tag" >/dev/null
echo "make-base.sh: $tag ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}'))"
