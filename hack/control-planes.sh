#!/usr/bin/env bash
# Start filling the cache of both control planes of the e2e matrix in the background, so that
# their builds (on a fresh machine: v1.20.2 from Debian's source, minutes; v1.37.2 from Go
# modules, the better part of half an hour) overlap the unit tiers instead of preceding them.
#
# Usage: hack/control-planes.sh
#
# Returns at once. Two detached chains run: kube-apiserver.sh then kube-scheduler.sh (v1.20.2:
# one Debian source tree, one after the other), and kube-1.37.sh. Each script takes its own
# cache's flock, so the e2e fixtures that call the same scripts later simply wait for a build
# under way and then find it cached; a build that failed here is tried again there, and its
# error is reported by the test tier (its own log: $LOG_DIR/<script>.log). A cache that is
# already filled costs a version check and nothing else.
set -euo pipefail

readonly PROG="control-planes.sh"
HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/common.sh
source "$HACK/lib/common.sh"

[[ $# -eq 0 ]] || die "no arguments expected (usage: hack/control-planes.sh)"
if [[ "${KOORD_SKIP_E2E:-}" == 1 ]]; then
  log "KOORD_SKIP_E2E=1: no control plane built"
  exit 0
fi

LOG_DIR="${KOORD_CACHE_DIR:-$HOME/.cache/koord-py}/build-logs"
mkdir -p "$LOG_DIR"

run_detached() {  # run_detached NAME CMD...: in its own session, output to LOG_DIR/NAME.log
  local name="$1"
  shift
  setsid bash -c "$*" </dev/null >"$LOG_DIR/$name.log" 2>&1 &
}

run_detached kube-1.20 "bash '$HACK/kube-apiserver.sh' && bash '$HACK/kube-scheduler.sh'"
run_detached kube-1.37 "bash '$HACK/kube-1.37.sh'"
log "building (or finding cached) v1.20.2 and v1.37.2 in the background; logs in $LOG_DIR"
