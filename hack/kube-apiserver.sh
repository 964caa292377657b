#!/usr/bin/env bash
# Provide a kube-apiserver v1.20.2 and an etcd binary for the real-API-server test tier.
#
# On success prints exactly two lines on stdout:
#   KUBE_APISERVER_BIN=/abs/path/kube-apiserver
#   ETCD_BIN=/abs/path/etcd
# All progress goes to stderr. On failure exits non-zero with one "kube-apiserver.sh: ..." line
# (the last line on stderr).
#
# Resolution order:
#   1. env KUBE_APISERVER_BIN / ETCD_BIN, when they name executables (e.g. from setup-envtest);
#   2. the cache ${KOORD_CACHE_DIR:-$HOME/.cache/koord-py}/kube-apiserver-v1.20.2/kube-apiserver
#      (etcd: Debian's etcd-server, /usr/bin/etcd, or any etcd on PATH);
#   3. build from Debian bookworm's `kubernetes` source package (needs root + apt; ~2.3 GB of
#      scratch space under the cache dir, removed afterwards; a few minutes on 2 cores).
# Idempotent; concurrent callers serialise on a flock, so only one of them builds.
set -euo pipefail

readonly K8S_VERSION="v1.20.2"
readonly PROG="kube-apiserver.sh"

NEED_APT_HINT="set KUBE_APISERVER_BIN and ETCD_BIN"
# shellcheck source=hack/lib/kube-source.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/kube-source.sh"

# True when "$1 --version" reports the wanted version.
apiserver_ok() {
  local out
  is_exe "$1" || return 1
  out="$("$1" --version 2>/dev/null)" || return 1
  [[ "$out" == *"$K8S_VERSION"* ]]
}

emit() {
  printf 'KUBE_APISERVER_BIN=%s\n' "$(abspath "$1")"
  printf 'ETCD_BIN=%s\n' "$(abspath "$2")"
}

find_etcd() {
  local c
  if is_exe "${ETCD_BIN:-}"; then abspath "$ETCD_BIN"; return 0; fi
  if is_exe /usr/bin/etcd; then echo /usr/bin/etcd; return 0; fi
  if c="$(command -v etcd 2>/dev/null)" && is_exe "$c"; then abspath "$c"; return 0; fi
  return 1
}

# --- 1. explicit binaries from the environment --------------------------------------------
if [[ -n "${KUBE_APISERVER_BIN:-}" || -n "${ETCD_BIN:-}" ]]; then
  if is_exe "${KUBE_APISERVER_BIN:-}" && is_exe "${ETCD_BIN:-}"; then
    log "using binaries from the environment"
    emit "$KUBE_APISERVER_BIN" "$ETCD_BIN"
    exit 0
  fi
  log "KUBE_APISERVER_BIN/ETCD_BIN not both executables; falling back to the cache/build"
fi

CACHE_ROOT="${KOORD_CACHE_DIR:-${HOME:-/root}/.cache/koord-py}"
CACHE_DIR="$(abspath "$CACHE_ROOT")/kube-apiserver-${K8S_VERSION}"
CACHED_BIN="$CACHE_DIR/kube-apiserver"

# Preferred apiserver: a valid env one, else the cache.
APISERVER=""
if is_exe "${KUBE_APISERVER_BIN:-}"; then
  APISERVER="$(abspath "$KUBE_APISERVER_BIN")"
fi

# --- 2. fast path: cache hit, no lock needed ----------------------------------------------
if [[ -z "$APISERVER" ]] && apiserver_ok "$CACHED_BIN"; then APISERVER="$CACHED_BIN"; fi
if [[ -n "$APISERVER" ]] && ETCD="$(find_etcd)"; then
  emit "$APISERVER" "$ETCD"
  exit 0
fi

# --- 3. build / install under a lock ------------------------------------------------------
mkdir -p "$CACHE_DIR" || die "cannot create cache dir $CACHE_DIR"
exec 9>"$CACHE_DIR/.lock" || die "cannot open lock file $CACHE_DIR/.lock"
if ! flock -n 9; then
  log "another caller holds $CACHE_DIR/.lock (building?); waiting for it"
  flock 9 || die "cannot take lock $CACHE_DIR/.lock"
fi

# Another caller may have finished the work while we waited.
if [[ -z "$APISERVER" ]] && apiserver_ok "$CACHED_BIN"; then APISERVER="$CACHED_BIN"; fi

trap kube_cleanup EXIT
trap 'exit 130' INT TERM

build_apiserver() {
  local start end bin
  start="$(date +%s)"
  kube_remove_stale "$CACHE_DIR"
  BUILD_DIR="$(mktemp -d "$CACHE_DIR/build.XXXXXX")"
  kube_fetch_source "$BUILD_DIR"
  apt_install etcd-server
  bin="$(kube_make "$KUBE_SRC" cmd/kube-apiserver "$K8S_VERSION")"
  apiserver_ok "$bin" || die "built binary does not report $K8S_VERSION: $("$bin" --version 2>&1 | head -n1)"
  { install -m 0755 "$bin" "$CACHED_BIN.tmp" && mv -f "$CACHED_BIN.tmp" "$CACHED_BIN"; } \
    || die "cannot copy the binary into $CACHE_DIR"
  kube_cleanup
  BUILD_DIR=""
  end="$(date +%s)"
  log "built $CACHED_BIN in $((end - start)) s"
}

if [[ -z "$APISERVER" ]]; then
  build_apiserver
  APISERVER="$CACHED_BIN"
fi

if ! ETCD="$(find_etcd)"; then
  apt_install etcd-server
  ETCD="$(find_etcd)" || die "etcd-server installed but no etcd binary found"
fi

emit "$APISERVER" "$ETCD"
