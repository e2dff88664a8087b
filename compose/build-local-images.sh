#!/usr/bin/env bash
# Builds fencelock's container images from Debian's packages, pulling nothing from any
# registry (this machine and CI have none):
#
#   fencelock/debian:bookworm   a debootstrap root filesystem (minbase + the servers'
#                               packages), turned into a base image with `docker import`
#   fencelock/etcd:local        etcd 3.4 (etcd-server, etcdctl)
#   fencelock/redis:local       redis-server 7.0 and redis-sentinel
#   fencelock/postgres:local    PostgreSQL 15, with an entrypoint that initialises the
#                               cluster from POSTGRES_* like the official image's
#   fencelock/zookeeper:local   ZooKeeper 3.8 (installed on top of the base, so that an
#                               existing base image serves), configured from ZOO_MY_ID
#                               and ZOO_SERVERS like the official image
#
# SUITE=trixie builds the same from Debian 13 instead, tagged :trixie: etcd 3.5, Redis 8.0
# with its Sentinel, PostgreSQL 17 (`. compose/trixie-images.env` selects them).
#
# The compose file and the test harness pick them up through FENCELOCK_ETCD_IMAGE,
# FENCELOCK_REDIS_IMAGE and FENCELOCK_POSTGRES_IMAGE (`. compose/local-images.env`).
# Images that exist are kept (FORCE=1 rebuilds). Needs root (debootstrap) and Docker.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
suite="${SUITE:-bookworm}"
mirror="${MIRROR:-http://deb.debian.org/debian}"
base="fencelock/debian:${suite}"
case "$suite" in
  bookworm)
    packages=etcd-server,etcd-client,redis-server,redis-sentinel,postgresql,procps,iproute2
    pg_major=15
    tag=local
    ;;
  trixie)
    packages=etcd-server,etcd-client,redis-server,redis-sentinel,postgresql-17,procps,iproute2
    pg_major=17
    tag=trixie
    ;;
  *)
    echo "SUITE must be bookworm or trixie" >&2
    exit 2
    ;;
esac

have() { [ "${FORCE:-0}" != 1 ] && docker image inspect "$1" >/dev/null 2>&1; }

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  as_root=(sudo)
fi

if ! have "$base"; then
  if ! command -v debootstrap >/dev/null; then
    "${as_root[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -q --no-install-recommends debootstrap
  fi
  rootfs="$(mktemp -d /var/tmp/fencelock-rootfs.XXXXXX)"
  trap '"${as_root[@]}" rm -rf "$rootfs"' EXIT
  echo "debootstrap $suite into $rootfs (a few minutes)" >&2
  started=$SECONDS
  "${as_root[@]}" debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >&2
  # Smaller image: no package cache, no apt lists.
  "${as_root[@]}" rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  "${as_root[@]}" tar -C "$rootfs" -c . |
    docker import --change 'CMD ["bash"]' --change 'ENV LANG=C.UTF-8' - "$base" >/dev/null
  echo "built $base in $((SECONDS - started)) s" >&2
fi

servers=(etcd redis postgres)
# ZooKeeper 3.8 from bookworm only (the trixie suite's compose runs use this image too).
if [ "$suite" = bookworm ]; then
  servers+=(zookeeper)
fi
for server in "${servers[@]}"; do
  image="fencelock/${server}:${tag}"
  if have "$image"; then
    continue
  fi
  docker build -q --build-arg "BASE=$base" --build-arg "PG_MAJOR=$pg_major" -t "$image" -f "$here/images/Dockerfile.$server" "$here/images" >/dev/null
  echo "built $image" >&2
done
