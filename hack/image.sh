#!/usr/bin/env bash
# Build the koord-py OCI image (both commands: koord-scheduler and koordlet) from package
# registries only: a Debian bookworm rootfs from Debian's `debootstrap` (+ python3), the
# project's wheel and its dependencies from PyPI installed with pip in /opt/koord-py, a non-root
# user (65532, "koord"), committed with Debian's `podman` (`podman import`) as
#   ${IMAGE:-koord-py}:<version from pyproject.toml>
# and saved as an OCI archive at ${OUT:-dist}/koord-py-<version>.oci.tar.
#
# Needs root (debootstrap, chroot), apt (installs debootstrap and podman when missing) and the
# network of the package registries. The base rootfs (debootstrap + python3, ~40 s and ~150 MB
# when cached) is kept in ${KOORD_CACHE_DIR:-$HOME/.cache/koord-py}/image-base-bookworm.tar.
# On success prints IMAGE=<name:tag> and ARCHIVE=<path>; on failure one "image.sh: error: ..."
# line on stderr and exit 1. Probe only (exit 0 when this machine can build and run containers,
# 1 with the reason otherwise): `hack/image.sh --probe`.
set -euo pipefail
readonly PROG="image.sh"
log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cache="${KOORD_CACHE_DIR:-${HOME:-/root}/.cache/koord-py}"
[[ "$cache" == /* ]] || cache="$PWD/$cache"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
version="$(sed -nE 's/^version = "([^"]+)"/\1/p' "$repo/pyproject.toml" | head -n1)"
[[ -n "$version" ]] || die "no version in pyproject.toml"
image="${IMAGE:-koord-py}:${version}"
out="${OUT:-$repo/dist}"

need_tools() {
  local missing=()
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  command -v podman >/dev/null 2>&1 || missing+=(podman)
  if ((${#missing[@]})); then
    [[ "$(id -u)" == 0 ]] || die "needs ${missing[*]} (not root: cannot apt-get install)"
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq \
      --no-install-recommends "${missing[@]}" crun >&2 || die "apt-get install ${missing[*]} failed"
  fi
}

probe() {
  [[ "$(id -u)" == 0 ]] || die "not root: debootstrap and chroot need root"
  need_tools
  local tmp
  tmp="$(mktemp -d)"
  # The smallest image there is: the host's /bin/true and the libraries it links.
  local f
  for f in /bin/true $(ldd /bin/true | grep -oE '/[^ ]+'); do
    mkdir -p "$tmp$(dirname "$f")" && cp -L "$f" "$tmp$f"
  done
  tar -C "$tmp" -c . | podman import - koord-py-probe:latest >/dev/null 2>&1 \
    || { rm -rf "$tmp"; die "podman import fails on this machine"; }
  rm -rf "$tmp"
  local msg
  if ! msg="$(podman run --rm --network=none koord-py-probe:latest /bin/true 2>&1)"; then
    podman rmi -f koord-py-probe:latest >/dev/null 2>&1 || true
    die "podman run fails on this machine: $(printf '%s' "$msg" | tail -n1)"
  fi
  podman rmi -f koord-py-probe:latest >/dev/null 2>&1 || true
  log "this machine builds and runs containers"
}

if [[ "${1:-}" == "--probe" ]]; then probe; exit 0; fi
[[ "$(id -u)" == 0 ]] || die "not root: debootstrap and chroot need root"
need_tools
mkdir -p "$cache" "$out"
exec 9>"$cache/image.lock"
flock 9 || die "cannot lock $cache/image.lock"

# The same sources make the same image: skip the build when the image carries their hash.
src_hash="$(cd "$repo" && find apis scheduler koordlet runtimehooks pyproject.toml README.md \
  -type f \( -name '*.py' -o -name '*.toml' -o -name '*.md' -o -name '*.proto' \) -print0 \
  | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)"
archive="$out/koord-py-$version.oci.tar"
if [[ "${FORCE:-0}" != 1 && -s "$archive" ]] \
  && [[ "$(podman image inspect --format '{{index .Config.Labels "org.koord-py.source-hash"}}' \
        "$image" 2>/dev/null)" == "$src_hash" ]]; then
  log "$image is up to date with the sources ($src_hash); FORCE=1 rebuilds"
  printf 'IMAGE=%s\nARCHIVE=%s\n' "$image" "$archive"
  exit 0
fi

base="$cache/image-base-bookworm.tar"
work="$(mktemp -d "$cache/image-build.XXXXXX")"
cleanup() {
  for m in dev/pts dev proc; do umount "$work/rootfs/$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs"

if [[ ! -s "$base" ]]; then
  log "debootstrap bookworm (minbase + python3) from $mirror; a minute or two"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "$mirror" >&2 || die "debootstrap failed"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -cf "$base.tmp" . && mv "$base.tmp" "$base" || die "cannot write $base"
else
  log "base rootfs from the cache: $base"
  tar -C "$rootfs" -xf "$base" || die "cannot unpack $base"
fi

log "building the wheel of koord-py $version"
py="${PYTHON:-python3}"
[[ -x "$repo/.venv/bin/python" ]] && py="$repo/.venv/bin/python"
"$py" -m pip wheel --quiet --no-deps --disable-pip-version-check -w "$work/wheels" "$repo" >&2 \
  || die "pip wheel failed"
wheel="$(find "$work/wheels" -name 'koord_py-*.whl' | head -n1)"
[[ -n "$wheel" ]] || die "no koord_py wheel built"
# The dependencies come from the package index this machine's pip is configured for (PyPI or
# its mirror), downloaded here for the rootfs's CPython 3.11 and installed there offline.
log "downloading the dependencies (pip download, CPython 3.11 manylinux wheels)"
"$py" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
  --python-version 3.11 --implementation cp --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
  -d "$work/wheels" "$wheel" >&2 || die "pip download of the dependencies failed"
mkdir -p "$rootfs/tmp/wheels"
cp "$work/wheels"/*.whl "$rootfs/tmp/wheels/"

log "installing $(basename "$wheel") and its dependencies into /opt/koord-py"
mount -t proc proc "$rootfs/proc" || die "cannot mount proc in the rootfs"
chroot "$rootfs" /bin/sh -euc "
  python3 -m venv /opt/koord-py
  /opt/koord-py/bin/pip install --quiet --no-cache-dir --disable-pip-version-check \
    --no-index --find-links /tmp/wheels /tmp/wheels/$(basename "$wheel")
  rm -rf /tmp/wheels
  /opt/koord-py/bin/koord-scheduler --version
  echo 'koord:x:65532:65532:koord-py:/nonexistent:/usr/sbin/nologin' >>/etc/passwd
  echo 'koord:x:65532:' >>/etc/group
  ln -s /opt/koord-py/bin/koord-scheduler /opt/koord-py/bin/koordlet /usr/local/bin/
" >&2 || die "installing the wheel in the rootfs failed"
umount "$rootfs/proc"
find "$rootfs/opt/koord-py" -name '__pycache__' -prune -o -name '*.pyc' -print0 | xargs -0 rm -f

log "committing $image with podman"
created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
tar --numeric-owner -C "$rootfs" -c . | podman import \
  --change "USER 65532:65532" \
  --change "ENV PATH=/opt/koord-py/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --change "ENV PYTHONDONTWRITEBYTECODE=1" \
  --change "WORKDIR /" \
  --change "ENTRYPOINT []" \
  --change "CMD [\"koord-scheduler\", \"--help\"]" \
  --change "LABEL org.opencontainers.image.title=koord-py" \
  --change "LABEL org.opencontainers.image.version=$version" \
  --change "LABEL org.opencontainers.image.created=$created" \
  --change "LABEL org.opencontainers.image.licenses=Apache-2.0" \
  --change "LABEL org.koord-py.source-hash=$src_hash" \
  - "$image" >&2 || die "podman import failed"
rm -f "$archive"
podman save --format oci-archive -o "$archive" "$image" >&2 || die "podman save failed"
printf 'IMAGE=%s\nARCHIVE=%s\n' "$image" "$archive"
