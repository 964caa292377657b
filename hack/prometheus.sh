#!/usr/bin/env bash
# Provide Debian's Prometheus server and promtool for the Prometheus test tier.
#
# On success prints exactly two lines on stdout:
#   PROMETHEUS_BIN=/abs/path/prometheus
#   PROMTOOL_BIN=/abs/path/promtool
# Progress goes to stderr; on failure one "prometheus.sh: error: ..." line and exit 1.
#
# Resolution order:
#   1. env PROMETHEUS_BIN and PROMTOOL_BIN, when both name executables;
#   2. the cache ${KOORD_CACHE_DIR:-$HOME/.cache/koord-py}/prometheus-deb/usr/bin/;
#   3. Debian's `prometheus` package (bookworm: 2.42), fetched with `apt-get download` and
#      unpacked with `dpkg-deb -x` into that cache (static Go binaries; nothing is installed
#      system-wide and no service is started). About 20 MB, seconds.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/debtool.sh
source "$here/lib/debtool.sh"

if [[ -x "${PROMETHEUS_BIN:-}" && -x "${PROMTOOL_BIN:-}" ]]; then
  printf 'PROMETHEUS_BIN=%s\nPROMTOOL_BIN=%s\n' "$PROMETHEUS_BIN" "$PROMTOOL_BIN"
  exit 0
fi
debtool_provide prometheus.sh prometheus prometheus-deb usr/bin/prometheus usr/bin/promtool
"$DEBTOOL_DIR/usr/bin/promtool" --version >/dev/null 2>&1 \
  || debtool_die "$DEBTOOL_DIR/usr/bin/promtool does not run"
printf 'PROMETHEUS_BIN=%s\nPROMTOOL_BIN=%s\n' \
  "$DEBTOOL_DIR/usr/bin/prometheus" "$DEBTOOL_DIR/usr/bin/promtool"
