#!/usr/bin/env bash
# Provide a kube-apiserver v1.20.2 and an etcd binary for the real-API-server test tier.
#
# On success prints exactly two lines on stdout:
#   KUBE_APISERVER_BIN=/abs/path/kube-apiserver
#   ETCD_BIN=/abs/path/etcd
# All progress goes to stderr. On failure exits non-zero with one "kube-apiserver.sh: ..." line
# (the last line on stderr).
#
# Resolution order:
#   1. env KUBE_APISERVER_BIN / ETCD_BIN, when they name executables (e.g. from setup-envtest);
#   2. the cache ${KOORD_CACHE_DIR:-$HOME/.cache/koord-py}/kube-apiserver-v1.20.2/kube-apiserver
#      (etcd: Debian's etcd-server, /usr/bin/etcd, or any etcd on PATH);
#   3. build from Debian bookworm's `kubernetes` source package (needs root + apt; ~2.3 GB of
#      scratch space under the cache dir, removed afterwards; a few minutes on 2 cores).
# Idempotent; concurrent callers serialise on a flock, so only one of them builds.
set -euo pipefail

readonly K8S_VERSION="v1.20.2"
readonly PROG="kube-apiserver.sh"

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

is_exe() { [[ -n "${1:-}" && -f "$1" && -x "$1" ]]; }

abspath() {
  local p="$1"
  if [[ "$p" != /* ]]; then p="$PWD/$p"; fi
  printf '%s\n' "$p"
}

# True when "$1 --version" reports the wanted version.
apiserver_ok() {
  local out
  is_exe "$1" || return 1
  out="$("$1" --version 2>/dev/null)" || return 1
  [[ "$out" == *"$K8S_VERSION"* ]]
}

emit() {
  printf 'KUBE_APISERVER_BIN=%s\n' "$(abspath "$1")"
  printf 'ETCD_BIN=%s\n' "$(abspath "$2")"
}

find_etcd() {
  local c
  if is_exe "${ETCD_BIN:-}"; then abspath "$ETCD_BIN"; return 0; fi
  if is_exe /usr/bin/etcd; then echo /usr/bin/etcd; return 0; fi
  if c="$(command -v etcd 2>/dev/null)" && is_exe "$c"; then abspath "$c"; return 0; fi
  return 1
}

# --- 1. explicit binaries from the environment --------------------------------------------
if [[ -n "${KUBE_APISERVER_BIN:-}" || -n "${ETCD_BIN:-}" ]]; then
  if is_exe "${KUBE_APISERVER_BIN:-}" && is_exe "${ETCD_BIN:-}"; then
    log "using binaries from the environment"
    emit "$KUBE_APISERVER_BIN" "$ETCD_BIN"
    exit 0
  fi
  log "KUBE_APISERVER_BIN/ETCD_BIN not both executables; falling back to the cache/build"
fi

CACHE_ROOT="${KOORD_CACHE_DIR:-${HOME:-/root}/.cache/koord-py}"
CACHE_DIR="$(abspath "$CACHE_ROOT")/kube-apiserver-${K8S_VERSION}"
CACHED_BIN="$CACHE_DIR/kube-apiserver"

# Preferred apiserver: a valid env one, else the cache.
APISERVER=""
if is_exe "${KUBE_APISERVER_BIN:-}"; then
  APISERVER="$(abspath "$KUBE_APISERVER_BIN")"
fi

# --- 2. fast path: cache hit, no lock needed ----------------------------------------------
if [[ -z "$APISERVER" ]] && apiserver_ok "$CACHED_BIN"; then APISERVER="$CACHED_BIN"; fi
if [[ -n "$APISERVER" ]] && ETCD="$(find_etcd)"; then
  emit "$APISERVER" "$ETCD"
  exit 0
fi

# --- 3. build / install under a lock ------------------------------------------------------
mkdir -p "$CACHE_DIR" || die "cannot create cache dir $CACHE_DIR"
exec 9>"$CACHE_DIR/.lock" || die "cannot open lock file $CACHE_DIR/.lock"
if ! flock -n 9; then
  log "another caller holds $CACHE_DIR/.lock (building?); waiting for it"
  flock 9 || die "cannot take lock $CACHE_DIR/.lock"
fi

# Another caller may have finished the work while we waited.
if [[ -z "$APISERVER" ]] && apiserver_ok "$CACHED_BIN"; then APISERVER="$CACHED_BIN"; fi

APT_UPDATED=0
need_apt() {
  command -v apt-get >/dev/null 2>&1 \
    || die "no kube-apiserver/etcd available and no apt-get to build them; set KUBE_APISERVER_BIN and ETCD_BIN"
  [[ "$(id -u)" == 0 ]] \
    || die "building kube-apiserver needs root (apt-get); run once as root or set KUBE_APISERVER_BIN and ETCD_BIN"
}

apt_update() {
  if [[ "$APT_UPDATED" == 0 ]]; then
    log "apt-get update"
    apt-get update -qq >&2 || die "apt-get update failed"
    APT_UPDATED=1
  fi
}

apt_install() {
  need_apt
  apt_update
  log "apt-get install -y $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 \
    || die "apt-get install $* failed"
}

has_deb_src() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    if grep -Eq '^[[:space:]]*deb-src[[:space:]].*bookworm' "$f"; then return 0; fi
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    # A deb822 stanza that is enabled, has deb-src among its Types and bookworm in its Suites.
    if awk '
      BEGIN { RS = ""; found = 0 }
      {
        if ($0 ~ /(^|\n)[Tt]ypes:[^\n]*deb-src/ && $0 ~ /(^|\n)[Ss]uites:[^\n]*bookworm/ \
            && $0 !~ /(^|\n)[Ee]nabled:[[:space:]]*[Nn]o/) found = 1
      }
      END { exit(found ? 0 : 1) }' "$f"; then
      return 0
    fi
  done
  return 1
}

# Adds deb-src entries mirroring the existing bookworm deb entries (both apt source formats),
# in a file of our own; existing source files are never edited.
add_deb_src() {
  local f out822=/etc/apt/sources.list.d/koord-py-deb-src.sources
  local outlist=/etc/apt/sources.list.d/koord-py-deb-src.list
  local tmp822 tmplist
  tmp822="$(mktemp)"; tmplist="$(mktemp)"
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" && "$f" != "$out822" ]] || continue
    awk '
      BEGIN { RS = "" }
      {
        n = split($0, L, "\n"); types = ""; suites = ""; enabled = 1
        for (i = 1; i <= n; i++) {
          if (L[i] ~ /^[Tt]ypes:/) types = L[i]
          if (L[i] ~ /^[Ss]uites:/) suites = L[i]
          if (L[i] ~ /^[Ee]nabled:[[:space:]]*[Nn]o/) enabled = 0
        }
        if (!enabled || suites !~ /bookworm/ || types !~ /[[:space:]]deb([[:space:]]|$)/) next
        out = ""
        for (i = 1; i <= n; i++) {
          line = L[i]
          if (line ~ /^[[:space:]]*#/) continue
          if (line ~ /^[Tt]ypes:/) line = "Types: deb-src"
          out = out line "\n"
        }
        printf "%s", out; printf "\n"
      }' "$f" >>"$tmp822"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" && "$f" != "$outlist" ]] || continue
    sed -nE 's/^[[:space:]]*deb([[:space:]]+.*bookworm.*)$/deb-src\1/p' "$f" >>"$tmplist"
  done
  if [[ -s "$tmp822" ]]; then
    log "adding deb-src entries in $out822"
    { echo "# Added by koord-py hack/kube-apiserver.sh (kubernetes source package)"; cat "$tmp822"; } >"$out822"
  fi
  if [[ -s "$tmplist" ]]; then
    log "adding deb-src entries in $outlist"
    { echo "# Added by koord-py hack/kube-apiserver.sh (kubernetes source package)"; sort -u "$tmplist"; } >"$outlist"
  fi
  if [[ ! -s "$tmp822" && ! -s "$tmplist" ]]; then
    rm -f "$tmp822" "$tmplist"
    die "no bookworm 'deb' entry in the apt sources to derive a deb-src entry from"
  fi
  rm -f "$tmp822" "$tmplist"
  APT_UPDATED=0
}

BUILD_DIR=""
cleanup() {
  if [[ -n "$BUILD_DIR" && -d "$BUILD_DIR" ]]; then
    log "removing build tree $BUILD_DIR"
    # Go's module cache is read-only; make it writable before deleting.
    chmod -R u+w "$BUILD_DIR" 2>/dev/null || true
    rm -rf "$BUILD_DIR"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

build_apiserver() {
  local start end src bin d
  start="$(date +%s)"
  need_apt
  if ! has_deb_src; then add_deb_src; fi
  apt_install golang-go etcd-server rsync dpkg-dev make \
    golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev

  local reflect2_src=/usr/share/gocode/src/github.com/modern-go/reflect2
  local jsoniter_src=/usr/share/gocode/src/github.com/json-iterator/go
  [[ -d "$reflect2_src" ]] || die "missing $reflect2_src (golang-github-modern-go-reflect2-dev)"
  [[ -d "$jsoniter_src" ]] || die "missing $jsoniter_src (golang-github-json-iterator-go-dev)"

  # Remove leftovers of an interrupted earlier build.
  for d in "$CACHE_DIR"/build.*; do
    [[ -d "$d" ]] || continue
    log "removing stale build tree $d"
    chmod -R u+w "$d" 2>/dev/null || true
    rm -rf "$d"
  done

  BUILD_DIR="$(mktemp -d "$CACHE_DIR/build.XXXXXX")"
  log "downloading Debian source package 'kubernetes' into $BUILD_DIR"
  (cd "$BUILD_DIR" && apt-get source --download-only kubernetes >&2) \
    || die "apt-get source --download-only kubernetes failed"
  local dsc
  dsc="$(find "$BUILD_DIR" -maxdepth 1 -name 'kubernetes_*.dsc' | head -n1)"
  [[ -n "$dsc" ]] || die "no kubernetes_*.dsc downloaded"
  log "unpacking $(basename "$dsc")"
  (cd "$BUILD_DIR" && dpkg-source -x "$(basename "$dsc")" src >&2) \
    || die "dpkg-source -x $(basename "$dsc") failed"
  src="$BUILD_DIR/src"
  [[ -f "$src/build/root/Makefile" || -f "$src/Makefile" ]] || die "unpacked tree has no Makefile"

  # reflect2 1.0.1 (vendored) panics under Go >= 1.18; use Debian's fixed copies.
  log "replacing vendored modern-go/reflect2 and json-iterator/go with Debian's copies"
  rsync -a --copy-links --delete "$reflect2_src/" "$src/vendor/github.com/modern-go/reflect2/" >&2 \
    || die "rsync reflect2 failed"
  rsync -a --copy-links --delete "$jsoniter_src/" "$src/vendor/github.com/json-iterator/go/" >&2 \
    || die "rsync json-iterator failed"
  rm -f "$src/vendor/github.com/modern-go/reflect2/go.mod" "$src/vendor/github.com/modern-go/reflect2/go.sum" \
    "$src/vendor/github.com/json-iterator/go/go.mod" "$src/vendor/github.com/json-iterator/go/go.sum"

  log "building cmd/kube-apiserver ($(go version 2>/dev/null || echo 'go ?')); this takes minutes"
  (
    cd "$src"
    export CGO_ENABLED=0 GOPROXY=off GOFLAGS=-mod=vendor GO111MODULE=on \
      GOCACHE="$BUILD_DIR/gocache" GOMODCACHE="$BUILD_DIR/gomodcache" GOTOOLCHAIN=local \
      KUBE_GIT_VERSION="$K8S_VERSION" KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 \
      KUBE_GIT_TREE_STATE=clean
    make WHAT=cmd/kube-apiserver >&2
  ) || die "make WHAT=cmd/kube-apiserver failed (see output above)"

  bin="$(find "$src/_output" -type f -name kube-apiserver -perm -u+x | head -n1)"
  [[ -n "$bin" ]] || die "build finished but no kube-apiserver binary under _output"
  apiserver_ok "$bin" || die "built binary does not report $K8S_VERSION: $("$bin" --version 2>&1 | head -n1)"
  { install -m 0755 "$bin" "$CACHED_BIN.tmp" && mv -f "$CACHED_BIN.tmp" "$CACHED_BIN"; } \
    || die "cannot copy the binary into $CACHE_DIR"
  cleanup
  BUILD_DIR=""
  end="$(date +%s)"
  log "built $CACHED_BIN in $((end - start)) s"
}

if [[ -z "$APISERVER" ]]; then
  build_apiserver
  APISERVER="$CACHED_BIN"
fi

if ! ETCD="$(find_etcd)"; then
  apt_install etcd-server
  ETCD="$(find_etcd)" || die "etcd-server installed but no etcd binary found"
fi

emit "$APISERVER" "$ETCD"
