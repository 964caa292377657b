#!/usr/bin/env bash
# Provide the current control plane: kube-apiserver, kube-controller-manager and kube-scheduler
# v1.37.2 and etcd v3.7.3, built from their Go modules.
#
# Usage: hack/kube-1.37.sh [--cached-only]
#
# On success prints exactly four lines on stdout:
#   KUBE_APISERVER_BIN=/abs/path/kube-apiserver
#   KUBE_CONTROLLER_MANAGER_BIN=/abs/path/kube-controller-manager
#   KUBE_SCHEDULER_BIN=/abs/path/kube-scheduler
#   ETCD_BIN=/abs/path/etcd
# All progress goes to stderr. On failure exits non-zero with one "kube-1.37.sh: error: ..."
# line (the last line on stderr).
#
# The binaries live in ${KOORD_CACHE_DIR:-$HOME/.cache/koord-py}/kube-v1.37.2/ with a `stamp`
# naming the recipe (wrapper go.mod/go.sum + flags) they were built from; a cache hit builds
# nothing. Otherwise they are built, one at a time, through the wrapper modules
# hack/gomod/kube-1.37 (k8s.io/kubernetes v1.37.2, staging modules pinned to v0.37.2) and
# hack/gomod/etcd-3.7 (go.etcd.io/etcd/server/v3 v3.7.3; a module of its own so etcd never moves
# the apiserver's dependencies). Needs Go >= 1.26 (env GO, else `go` on PATH) and the Go module
# proxy (or a warm module cache). Cold, on 2 shared cores, the build takes the better part of an
# hour; Go's build cache makes a rebuild after a flag change minutes.
# --cached-only: never build; fail (one line) when the cache does not hold this recipe.
# Idempotent; concurrent callers serialise on a flock, so only one of them builds.
set -euo pipefail

readonly PROG="kube-1.37.sh"
readonly K8S_VERSION="v1.37.2"
readonly ETCD_VERSION="3.7.3"
# Kubernetes' own release build (hack/lib/golang.sh of v1.37.2): these tags, -trimpath, -s -w.
readonly KUBE_TAGS="selinux,notest,grpcnotrace"

# shellcheck source=hack/lib/gomod-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/gomod-build.sh"

CACHED_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --cached-only) CACHED_ONLY=1 ;;
    *) die "unknown argument '$arg' (usage: hack/kube-1.37.sh [--cached-only])" ;;
  esac
done

KUBE_MOD="$GOMOD_ROOT/kube-1.37"
ETCD_MOD="$GOMOD_ROOT/etcd-3.7"
CACHE_DIR="$CACHE_ROOT/kube-${K8S_VERSION}"
KUBE_BINS=(kube-apiserver kube-controller-manager kube-scheduler)

kube_ldflags() {
  local minor="${K8S_VERSION#v1.}" pkg flags="-s -w"
  minor="${minor%%.*}"
  # component-base's version is what --version and /version report; client-go's is the
  # User-Agent the components send. Kubernetes stamps both.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean"
  done
  printf '%s\n' "$flags"
}
readonly ETCD_LDFLAGS="-s -w"

RECIPE=(
  "kubernetes=$K8S_VERSION tags=$KUBE_TAGS ldflags=$(kube_ldflags)"
  "etcd=$ETCD_VERSION ldflags=$ETCD_LDFLAGS"
  "flags=CGO_ENABLED=0 -trimpath"
)
KEY="$(gomod_recipe_key "$KUBE_MOD" "$ETCD_MOD" -- "${RECIPE[@]}")"

emit() {
  printf 'KUBE_APISERVER_BIN=%s\n' "$CACHE_DIR/kube-apiserver"
  printf 'KUBE_CONTROLLER_MANAGER_BIN=%s\n' "$CACHE_DIR/kube-controller-manager"
  printf 'KUBE_SCHEDULER_BIN=%s\n' "$CACHE_DIR/kube-scheduler"
  printf 'ETCD_BIN=%s\n' "$CACHE_DIR/etcd"
}

# version_ok BIN WANT: true when "BIN --version" mentions WANT.
version_ok() {
  local out
  out="$("$1" --version 2>&1)" || return 1
  [[ "$out" == *"$2"* ]]
}

if gomod_stamp_ok "$CACHE_DIR" "$KEY" "${KUBE_BINS[@]}" etcd; then emit; exit 0; fi
if [[ "$CACHED_ONLY" == 1 ]]; then
  die "the $K8S_VERSION control plane is not built in $CACHE_DIR (run 'make kube-1.37')"
fi

gomod_lock "$CACHE_DIR"
# Another caller may have finished the work while we waited.
if gomod_stamp_ok "$CACHE_DIR" "$KEY" "${KUBE_BINS[@]}" etcd; then emit; exit 0; fi

trap gomod_cleanup EXIT
trap 'exit 130' INT TERM

start="$(date +%s)"
gomod_begin_build "$CACHE_DIR"
for bin in "${KUBE_BINS[@]}"; do
  gomod_build "$KUBE_MOD" "k8s.io/kubernetes/cmd/$bin" "$CACHE_DIR/$bin" "$KUBE_TAGS" "$(kube_ldflags)"
  version_ok "$GOMOD_BUILT" "$K8S_VERSION" \
    || die "built $bin does not report $K8S_VERSION: $("$GOMOD_BUILT" --version 2>&1 | head -n1)"
  gomod_install "$GOMOD_BUILT" "$CACHE_DIR/$bin"
done
gomod_build "$ETCD_MOD" go.etcd.io/etcd/server/v3 "$CACHE_DIR/etcd" "" "$ETCD_LDFLAGS"
version_ok "$GOMOD_BUILT" "etcd Version: $ETCD_VERSION" \
  || die "built etcd does not report $ETCD_VERSION: $("$GOMOD_BUILT" --version 2>&1 | head -n1)"
gomod_install "$GOMOD_BUILT" "$CACHE_DIR/etcd"

gomod_write_stamp "$CACHE_DIR" "$KEY" "${RECIPE[@]}" "go=$("$(gomod_go "$KUBE_MOD")" env GOVERSION)"
log "control plane $K8S_VERSION + etcd $ETCD_VERSION ready in $CACHE_DIR ($(($(date +%s) - start)) s)"
emit
