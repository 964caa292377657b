#!/usr/bin/env bash
# Provide the kubelet's own deviceplugin/v1beta1 api.proto (Kubernetes v1.20.2, from Debian
# bookworm's `kubernetes` source package) for the device-plugin tests, which generate a client
# from it to play the kubelet.
#
# On success prints exactly one line on stdout:
#   KUBELET_DEVICEPLUGIN_PROTO_ROOT=/abs/dir   (include root: k8s.io/kubelet/pkg/apis/deviceplugin/
#                                              v1beta1/api.proto and github.com/gogo/protobuf/
#                                              gogoproto/gogo.proto below it)
# Progress goes to stderr; on failure exits non-zero with one "kubelet-deviceplugin-proto.sh: ..."
# line. Cached under ${KOORD_CACHE_DIR:-$HOME/.cache/koord-py}; only the two .proto files are
# kept (the 34 MB source tarball is read once, then removed). Needs a deb-src entry for bookworm
# (hack/kube-apiserver.sh adds one when it builds) or an existing cache.
set -euo pipefail

readonly PROG="kubelet-deviceplugin-proto.sh"
log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

CACHE_ROOT="${KOORD_CACHE_DIR:-${HOME:-/root}/.cache/koord-py}"
ROOT="$CACHE_ROOT/kubelet-deviceplugin-v1.20.2"
API="$ROOT/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto"
GOGO="$ROOT/github.com/gogo/protobuf/gogoproto/gogo.proto"

if [[ -s "$API" && -s "$GOGO" ]]; then
  printf 'KUBELET_DEVICEPLUGIN_PROTO_ROOT=%s\n' "$ROOT"
  exit 0
fi

command -v apt-get >/dev/null || die "apt-get not found (not a Debian system?)"
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.kubelet-deviceplugin.lock"
flock 9
if [[ -s "$API" && -s "$GOGO" ]]; then
  printf 'KUBELET_DEVICEPLUGIN_PROTO_ROOT=%s\n' "$ROOT"
  exit 0
fi

has_deb_src() {
  grep -rqsE '^[[:space:]]*deb-src .*bookworm' /etc/apt/sources.list /etc/apt/sources.list.d/ \
    || grep -rqsE '^Types:.*deb-src' /etc/apt/sources.list.d/
}
if ! has_deb_src; then
  # The same rule as hack/kube-apiserver.sh: a deb-src twin of every bookworm deb entry.
  log "adding deb-src entries for bookworm"
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] && grep -q bookworm "$f" || continue
    sed -E 's/^Types:.*/Types: deb-src/' "$f" >"/etc/apt/sources.list.d/koord-py-src-$(basename "$f")"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    sed -nE 's/^[[:space:]]*deb([[:space:]]+.*bookworm.*)$/deb-src\1/p' "$f"
  done >/etc/apt/sources.list.d/koord-py-src.list
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 || die "apt-get update failed"
fi

tmp="$(mktemp -d "$CACHE_ROOT/kubelet-src.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log "downloading Debian source package 'kubernetes' (once)"
(cd "$tmp" && apt-get source --download-only kubernetes >&2) || {
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 || true
  (cd "$tmp" && apt-get source --download-only kubernetes >&2)
} || die "apt-get source --download-only kubernetes failed"
tarball="$(find "$tmp" -maxdepth 1 -name 'kubernetes_*.orig.tar.*' | head -n1)"
[[ -n "$tarball" ]] || die "no kubernetes_*.orig.tar.* downloaded"
tar -xf "$tarball" -C "$tmp" --wildcards \
  '*/staging/src/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto' \
  '*/vendor/github.com/gogo/protobuf/gogoproto/gogo.proto' \
  || die "the source tarball has no deviceplugin/v1beta1/api.proto"
mkdir -p "$(dirname "$API")" "$(dirname "$GOGO")"
cp "$tmp"/kubernetes-*/staging/src/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto "$API"
cp "$tmp"/kubernetes-*/vendor/github.com/gogo/protobuf/gogoproto/gogo.proto "$GOGO"
log "cached $API"
printf 'KUBELET_DEVICEPLUGIN_PROTO_ROOT=%s\n' "$ROOT"
