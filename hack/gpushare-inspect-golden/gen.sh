#!/usr/bin/env bash
# Regenerate tests/unit/fixtures/gpushare-inspect/golden.json: build gpushare's own
# `kubectl inspect gpushare` (cmd/inspect of github.com/AliyunContainerService/gpushare-device-plugin,
# GOPATH mode with its vendor/ directory: no network) from a checkout at GSP_SRC, then record
# its output on the golden cluster states against a real kube-apiserver (record.py).
# Needs a Go toolchain and the API-server tier (hack/kube-apiserver.sh). Also records Go's
# tabwriter alone on random texts (tabwriter.py).
set -euo pipefail
GSP_SRC="${GSP_SRC:?set GSP_SRC to a gpushare-device-plugin checkout (with vendor/)}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$HERE/../.."
D="$(mktemp -d)"; trap 'rm -rf "$D"' EXIT
mkdir -p "$D/src/github.com/AliyunContainerService"
cp -r "$GSP_SRC" "$D/src/github.com/AliyunContainerService/gpushare-device-plugin"
COMMIT="$(git -C "$GSP_SRC" rev-parse HEAD)"
(cd "$D/src/github.com/AliyunContainerService/gpushare-device-plugin" &&
  GOPATH="$D" GO111MODULE=off GOFLAGS= GOPROXY=off go build -o "$D/kubectl-inspect-gpushare" ./cmd/inspect)
cd "$REPO"
PYTHONPATH="$PWD" "${PYTHON:-python3}" "$HERE/record.py" "$D/kubectl-inspect-gpushare" \
  "github.com/AliyunContainerService/gpushare-device-plugin@$COMMIT cmd/inspect" "$(go version)"
# Go's tabwriter alone, on random texts (tests/unit/fixtures/gpushare-inspect/tabwriter.json).
"${PYTHON:-python3}" "$HERE/tabwriter.py"
