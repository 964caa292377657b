#!/usr/bin/env bash
# Regenerate tests/unit/apis/fixtures/kubelet-checkpoint/ (kubelet checkpoints and go-spew
# renderings with the kubelet's own checksum). checkpoint.go.txt holds Kubernetes v1.20.2's
# pkg/kubelet/cm/devicemanager/checkpoint types and checkpointmanager/checksum + util/hash code,
# verbatim; the <=1.19 package differs only in `DeviceIDs []string`. go-spew is copied from the
# vendor/ directory of a Kubernetes v1.20.2 source tree (KUBE_SRC; hack/kube-scheduler.sh unpacks
# one under ~/.cache/koord-py). Needs a Go toolchain; no network.
set -euo pipefail
KUBE_SRC="${KUBE_SRC:?set KUBE_SRC to a Kubernetes v1.20.2 source tree}"
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="$HERE/../../tests/unit/apis/fixtures/kubelet-checkpoint"
D="$(mktemp -d)"; trap 'rm -rf "$D"' EXIT
mkdir -p "$D/spew" "$D/checkpoint" "$D/checkpointv1"
cp "$KUBE_SRC"/vendor/github.com/davecgh/go-spew/spew/*.go "$D/spew/"
rm -f "$D"/spew/*_test.go
sed -i 's#"github.com/davecgh/go-spew/spew"#"cpsum/spew"#' "$D"/spew/*.go
printf 'module cpsum\n\ngo 1.19\n' > "$D/go.mod"
cp "$HERE/checkpoint.go.txt" "$D/checkpoint/checkpoint.go"
sed -e 's/DeviceIDs     DevicesPerNUMA/DeviceIDs     []string/' -e '/^type DevicesPerNUMA/d' \
  "$HERE/checkpoint.go.txt" > "$D/checkpointv1/checkpoint.go"
cp "$HERE/main.go.txt" "$D/main.go"
(cd "$D" && GOFLAGS=-mod=mod GOPROXY=off go run . > spew.txt && cp numa.json numa-empty.json v1.json spew.txt "$OUT/")
