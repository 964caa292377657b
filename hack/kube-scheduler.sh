#!/usr/bin/env bash
# Provide Go kube-scheduler v1.20.2, the reference scheduler of the side-by-side benchmark (B2)
# and of the extender e2e tier.
#
# On success prints exactly one line on stdout:
#   KUBE_SCHEDULER_BIN=/abs/path/kube-scheduler
# All progress goes to stderr. On failure exits non-zero with one "kube-scheduler.sh: ..." line
# (the last line on stderr).
#
# Resolution order:
#   1. env KUBE_SCHEDULER_BIN, when it names an executable reporting v1.20.2;
#   2. the cache ${KOORD_CACHE_DIR:-$HOME/.cache/koord-py}/kube-scheduler-v1.20.2/kube-scheduler
#      (beside kube-apiserver's);
#   3. build from Debian bookworm's `kubernetes` source package, the same tree and the same
#      fixes as hack/kube-apiserver.sh (hack/lib/kube-source.sh; needs root + apt, ~2.3 GB of
#      scratch space under the cache dir removed afterwards; a few minutes on 2 cores).
# Idempotent; concurrent callers serialise on a flock, so only one of them builds.
set -euo pipefail

readonly K8S_VERSION="v1.20.2"
readonly PROG="kube-scheduler.sh"

NEED_APT_HINT="set KUBE_SCHEDULER_BIN"
# shellcheck source=hack/lib/kube-source.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/kube-source.sh"

scheduler_ok() {
  local out
  is_exe "$1" || return 1
  out="$("$1" --version 2>/dev/null)" || return 1
  [[ "$out" == *"$K8S_VERSION"* ]]
}

emit() { printf 'KUBE_SCHEDULER_BIN=%s\n' "$(abspath "$1")"; }

if [[ -n "${KUBE_SCHEDULER_BIN:-}" ]]; then
  if scheduler_ok "$KUBE_SCHEDULER_BIN"; then
    log "using KUBE_SCHEDULER_BIN from the environment"
    emit "$KUBE_SCHEDULER_BIN"
    exit 0
  fi
  log "KUBE_SCHEDULER_BIN is not a $K8S_VERSION kube-scheduler; falling back to the cache/build"
fi

CACHE_ROOT="${KOORD_CACHE_DIR:-${HOME:-/root}/.cache/koord-py}"
CACHE_DIR="$(abspath "$CACHE_ROOT")/kube-scheduler-${K8S_VERSION}"
CACHED_BIN="$CACHE_DIR/kube-scheduler"

if scheduler_ok "$CACHED_BIN"; then emit "$CACHED_BIN"; exit 0; fi

mkdir -p "$CACHE_DIR" || die "cannot create cache dir $CACHE_DIR"
exec 9>"$CACHE_DIR/.lock" || die "cannot open lock file $CACHE_DIR/.lock"
if ! flock -n 9; then
  log "another caller holds $CACHE_DIR/.lock (building?); waiting for it"
  flock 9 || die "cannot take lock $CACHE_DIR/.lock"
fi
if scheduler_ok "$CACHED_BIN"; then emit "$CACHED_BIN"; exit 0; fi

trap kube_cleanup EXIT
trap 'exit 130' INT TERM

start="$(date +%s)"
kube_remove_stale "$CACHE_DIR"
BUILD_DIR="$(mktemp -d "$CACHE_DIR/build.XXXXXX")"
kube_fetch_source "$BUILD_DIR"
bin="$(kube_make "$KUBE_SRC" cmd/kube-scheduler "$K8S_VERSION")"
scheduler_ok "$bin" || die "built binary does not report $K8S_VERSION: $("$bin" --version 2>&1 | head -n1)"
{ install -m 0755 "$bin" "$CACHED_BIN.tmp" && mv -f "$CACHED_BIN.tmp" "$CACHED_BIN"; } \
  || die "cannot copy the binary into $CACHE_DIR"
kube_cleanup
BUILD_DIR=""
log "built $CACHED_BIN in $(($(date +%s) - start)) s"
emit "$CACHED_BIN"
