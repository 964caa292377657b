#!/usr/bin/env bash
# Provide helm v3.22.0, built from its Go module.
#
# Usage: hack/helm.sh [--cached-only]
#
# On success prints exactly one line on stdout:
#   HELM_BIN=/abs/path/helm
# All progress goes to stderr. On failure exits non-zero with one "helm.sh: error: ..." line
# (the last line on stderr).
#
# The binary lives in ${KOORD_CACHE_DIR:-$HOME/.cache/koord-py}/helm-v3.22.0/ with a `stamp`
# naming the recipe it was built from; a cache hit builds nothing. Otherwise it is built through
# the wrapper module hack/gomod/helm-3 (helm.sh/helm/v3 v3.22.0; a module of its own: helm pins
# its own k8s.io client libraries). Needs Go >= 1.26 (env GO, else `go` on PATH) and the Go
# module proxy (or a warm module cache). Version-stamped the way helm's Makefile does it.
# --cached-only: never build; fail (one line) when the cache does not hold this recipe.
# Idempotent; concurrent callers serialise on a flock, so only one of them builds.
set -euo pipefail

readonly PROG="helm.sh"
readonly HELM_VERSION="v3.22.0"

# shellcheck source=hack/lib/gomod-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/gomod-build.sh"

CACHED_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --cached-only) CACHED_ONLY=1 ;;
    *) die "unknown argument '$arg' (usage: hack/helm.sh [--cached-only])" ;;
  esac
done

HELM_MOD="$GOMOD_ROOT/helm-3"
CACHE_DIR="$CACHE_ROOT/helm-${HELM_VERSION}"

# helm's Makefile: its version, and the Kubernetes version its lint rules and chartutil assume
# (client-go v0.M.m -> 1.m); read from the wrapper's go.sum-checked build list.
helm_ldflags() {
  local client_go minor flags="-s -w"
  client_go="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$HELM_MOD/go.mod")"
  [[ "$client_go" == v0.* ]] || die "cannot read k8s.io/client-go's version from $HELM_MOD/go.mod"
  minor="${client_go#v0.}"
  minor="${minor%%.*}"
  flags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  flags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  flags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1"
  flags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  flags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1"
  flags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  printf '%s\n' "$flags"
}

LDFLAGS="$(helm_ldflags)"
RECIPE=("helm=$HELM_VERSION ldflags=$LDFLAGS" "flags=CGO_ENABLED=0 -trimpath")
KEY="$(gomod_recipe_key "$HELM_MOD" -- "${RECIPE[@]}")"

emit() { printf 'HELM_BIN=%s\n' "$CACHE_DIR/helm"; }

if gomod_stamp_ok "$CACHE_DIR" "$KEY" helm; then emit; exit 0; fi
if [[ "$CACHED_ONLY" == 1 ]]; then
  die "helm $HELM_VERSION is not built in $CACHE_DIR (run 'make helm')"
fi

gomod_lock "$CACHE_DIR"
if gomod_stamp_ok "$CACHE_DIR" "$KEY" helm; then emit; exit 0; fi

trap gomod_cleanup EXIT
trap 'exit 130' INT TERM

gomod_begin_build "$CACHE_DIR"
gomod_build "$HELM_MOD" helm.sh/helm/v3/cmd/helm "$CACHE_DIR/helm" "" "$LDFLAGS"
out="$("$GOMOD_BUILT" version --short 2>&1)" || die "built helm does not run: ${out%%$'\n'*}"
[[ "$out" == "$HELM_VERSION"* ]] || die "built helm reports '${out%%$'\n'*}', not $HELM_VERSION"
gomod_install "$GOMOD_BUILT" "$CACHE_DIR/helm"
gomod_write_stamp "$CACHE_DIR" "$KEY" "${RECIPE[@]}" "go=$("$(gomod_go "$HELM_MOD")" env GOVERSION)"
emit
