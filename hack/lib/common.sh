# The helpers every hack/lib build library shares: messages (log, die) and path checks.
# Sourced, never run; the caller sets PROG (its name, for messages).
# shellcheck shell=bash

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

is_exe() { [[ -n "${1:-}" && -f "$1" && -x "$1" ]]; }

abspath() {
  local p="$1"
  if [[ "$p" != /* ]]; then p="$PWD/$p"; fi
  printf '%s\n' "$p"
}
