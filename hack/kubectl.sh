#!/usr/bin/env bash
# Provide Debian's kubectl (package `kubernetes-client`, bookworm: v1.20.2, the API server's
# version) for the manifest test tier.
#
# On success prints exactly one line on stdout:
#   KUBECTL_BIN=/abs/path/kubectl
# Progress goes to stderr; on failure one "kubectl.sh: error: ..." line and exit 1.
#
# Resolution order:
#   1. env KUBECTL_BIN, when it names an executable;
#   2. the cache ${KOORD_CACHE_DIR:-$HOME/.cache/koord-py}/kubernetes-client-deb/usr/bin/kubectl;
#   3. `apt-get download kubernetes-client` + `dpkg-deb -x` into that cache. The package is not
#      installed, so a kubectl of another origin in /usr/bin (a cloud SDK's) is left alone and
#      never used by the tests.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/debtool.sh
source "$here/lib/debtool.sh"

if [[ -x "${KUBECTL_BIN:-}" ]]; then
  printf 'KUBECTL_BIN=%s\n' "$KUBECTL_BIN"
  exit 0
fi
debtool_provide kubectl.sh kubernetes-client kubernetes-client-deb usr/bin/kubectl
"$DEBTOOL_DIR/usr/bin/kubectl" version --client >/dev/null 2>&1 \
  || debtool_die "$DEBTOOL_DIR/usr/bin/kubectl does not run"
printf 'KUBECTL_BIN=%s\n' "$DEBTOOL_DIR/usr/bin/kubectl"
