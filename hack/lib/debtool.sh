#!/usr/bin/env bash
# Shared by hack/prometheus.sh and hack/kubectl.sh (sourced, not run): provide static binaries
# that a Debian package ships, without installing the package system-wide.
#
# debtool_provide PROG PACKAGE VERSION_GLOB CACHE_NAME BIN...
#   For each BIN (a path inside the package, e.g. usr/bin/promtool), print nothing; on success
#   the binaries lie under "$DEBTOOL_DIR/<BIN>" and DEBTOOL_DIR is set. Resolution:
#     1. the cache ${KOORD_CACHE_DIR:-$HOME/.cache/koord-py}/CACHE_NAME (a previous extraction);
#     2. `apt-get download PACKAGE` (apt-get update first when the lists are missing or the
#        download fails and we are root) and `dpkg-deb -x` into the cache.
#   The package is never installed (no maintainer scripts, no service started, no conflict with
#   another package owning the same path, e.g. a vendor kubectl in /usr/bin). Concurrent
#   callers serialise on a flock. On failure: one "PROG: error: ..." line on stderr, exit 1.
set -euo pipefail

debtool_log() { printf '%s: %s\n' "$DEBTOOL_PROG" "$*" >&2; }
debtool_die() { printf '%s: error: %s\n' "$DEBTOOL_PROG" "$*" >&2; exit 1; }

debtool_have_all() {
  local dir="$1"; shift
  local b
  for b in "$@"; do [[ -x "$dir/$b" ]] || return 1; done
  [[ -f "$dir/.complete" ]]
}

debtool_provide() {
  DEBTOOL_PROG="$1"; local pkg="$2" cache_name="$3"; shift 3
  local root="${KOORD_CACHE_DIR:-${HOME:-/root}/.cache/koord-py}"
  [[ "$root" == /* ]] || root="$PWD/$root"
  DEBTOOL_DIR="$root/$cache_name"
  if debtool_have_all "$DEBTOOL_DIR" "$@"; then return 0; fi

  mkdir -p "$DEBTOOL_DIR" || debtool_die "cannot create $DEBTOOL_DIR"
  exec 8>"$DEBTOOL_DIR.lock" || debtool_die "cannot open lock $DEBTOOL_DIR.lock"
  flock 8 || debtool_die "cannot take lock $DEBTOOL_DIR.lock"
  if debtool_have_all "$DEBTOOL_DIR" "$@"; then return 0; fi

  command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 \
    || debtool_die "no apt-get/dpkg-deb to fetch Debian's '$pkg' package"
  local tmp deb
  tmp="$(mktemp -d "$DEBTOOL_DIR.dl.XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  chmod 0777 "$tmp"  # apt's _apt sandbox user writes the download here
  debtool_log "apt-get download $pkg"
  if ! (cd "$tmp" && apt-get download "$pkg" >&2); then
    [[ "$(id -u)" == 0 ]] || debtool_die "apt-get download $pkg failed (not root, cannot apt-get update)"
    debtool_log "apt-get update"
    apt-get -o DPkg::Lock::Timeout=900 update -qq >&2 || debtool_die "apt-get update failed"
    (cd "$tmp" && apt-get download "$pkg" >&2) || debtool_die "apt-get download $pkg failed"
  fi
  deb="$(find "$tmp" -maxdepth 1 -name "${pkg}_*.deb" | head -n1)"
  [[ -n "$deb" ]] || debtool_die "apt-get download $pkg produced no .deb"
  debtool_log "extracting $(basename "$deb") into $DEBTOOL_DIR"
  rm -rf "$DEBTOOL_DIR.new"
  mkdir -p "$DEBTOOL_DIR.new"
  dpkg-deb -x "$deb" "$DEBTOOL_DIR.new" || debtool_die "dpkg-deb -x $(basename "$deb") failed"
  basename "$deb" >"$DEBTOOL_DIR.new/.complete"
  rm -rf "$DEBTOOL_DIR"
  mv "$DEBTOOL_DIR.new" "$DEBTOOL_DIR"
  local b
  for b in "$@"; do
    [[ -x "$DEBTOOL_DIR/$b" ]] || debtool_die "package $pkg has no executable $b"
  done
}
