# Shared by the hack/ scripts that build Kubernetes binaries from Debian bookworm's
# `kubernetes` source package (v1.20.2): kube-apiserver.sh, kube-scheduler.sh.
#
# Sourced, never run. The caller sets PROG (its name, for messages) before sourcing, and
# `trap kube_cleanup EXIT` after. Provides: log/die/is_exe/abspath; apt helpers (apt_install
# adds deb-src entries mirroring bookworm's deb entries, in a file of our own, when needed);
# kube_fetch_source DIR (download + unpack + the fixes every build needs; sets KUBE_SRC);
# kube_make SRC WHAT VERSION (an offline, vendored, CGO-free `make WHAT=...`).
# shellcheck shell=bash

# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

APT_UPDATED=0
# NEED_APT_HINT: what the user can do instead (set by the caller, e.g. "set KUBE_SCHEDULER_BIN").
need_apt() {
  command -v apt-get >/dev/null 2>&1 \
    || die "nothing to use and no apt-get to build it; ${NEED_APT_HINT:-see the script header}"
  [[ "$(id -u)" == 0 ]] \
    || die "building needs root (apt-get); run once as root or ${NEED_APT_HINT:-see the script header}"
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
    { echo "# Added by koord-py hack/lib/kube-source.sh (kubernetes source package)"; cat "$tmp822"; } >"$out822"
  fi
  if [[ -s "$tmplist" ]]; then
    log "adding deb-src entries in $outlist"
    { echo "# Added by koord-py hack/lib/kube-source.sh (kubernetes source package)"; sort -u "$tmplist"; } >"$outlist"
  fi
  if [[ ! -s "$tmp822" && ! -s "$tmplist" ]]; then
    rm -f "$tmp822" "$tmplist"
    die "no bookworm 'deb' entry in the apt sources to derive a deb-src entry from"
  fi
  rm -f "$tmp822" "$tmplist"
  APT_UPDATED=0
}

BUILD_DIR=""
kube_cleanup() {
  if [[ -n "$BUILD_DIR" && -d "$BUILD_DIR" ]]; then
    log "removing build tree $BUILD_DIR"
    # Go's module cache is read-only; make it writable before deleting.
    chmod -R u+w "$BUILD_DIR" 2>/dev/null || true
    rm -rf "$BUILD_DIR"
  fi
}

# kube_fetch_source DIR: Debian's kubernetes source unpacked in DIR/src, fixed to build with
# this Go; sets KUBE_SRC. DIR should be a fresh directory (removed by kube_cleanup).
kube_fetch_source() {
  local dir="$1" dsc src
  need_apt
  if ! has_deb_src; then add_deb_src; fi
  apt_install golang-go rsync dpkg-dev make \
    golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev

  local reflect2_src=/usr/share/gocode/src/github.com/modern-go/reflect2
  local jsoniter_src=/usr/share/gocode/src/github.com/json-iterator/go
  [[ -d "$reflect2_src" ]] || die "missing $reflect2_src (golang-github-modern-go-reflect2-dev)"
  [[ -d "$jsoniter_src" ]] || die "missing $jsoniter_src (golang-github-json-iterator-go-dev)"

  log "downloading Debian source package 'kubernetes' into $dir"
  (cd "$dir" && apt-get source --download-only kubernetes >&2) \
    || die "apt-get source --download-only kubernetes failed"
  dsc="$(find "$dir" -maxdepth 1 -name 'kubernetes_*.dsc' | head -n1)"
  [[ -n "$dsc" ]] || die "no kubernetes_*.dsc downloaded"
  log "unpacking $(basename "$dsc")"
  (cd "$dir" && dpkg-source -x "$(basename "$dsc")" src >&2) \
    || die "dpkg-source -x $(basename "$dsc") failed"
  src="$dir/src"
  [[ -f "$src/build/root/Makefile" || -f "$src/Makefile" ]] || die "unpacked tree has no Makefile"

  # reflect2 1.0.1 (vendored) panics under Go >= 1.18; use Debian's fixed copies.
  log "replacing vendored modern-go/reflect2 and json-iterator/go with Debian's copies"
  rsync -a --copy-links --delete "$reflect2_src/" "$src/vendor/github.com/modern-go/reflect2/" >&2 \
    || die "rsync reflect2 failed"
  rsync -a --copy-links --delete "$jsoniter_src/" "$src/vendor/github.com/json-iterator/go/" >&2 \
    || die "rsync json-iterator failed"
  rm -f "$src/vendor/github.com/modern-go/reflect2/go.mod" "$src/vendor/github.com/modern-go/reflect2/go.sum" \
    "$src/vendor/github.com/json-iterator/go/go.mod" "$src/vendor/github.com/json-iterator/go/go.sum"
  KUBE_SRC="$src"
}

# kube_remove_stale DIR: build trees left in DIR by an interrupted earlier build.
kube_remove_stale() {
  local d
  for d in "$1"/build.*; do
    [[ -d "$d" ]] || continue
    log "removing stale build tree $d"
    chmod -R u+w "$d" 2>/dev/null || true
    rm -rf "$d"
  done
}

# Debian bookworm's Go (golang-go -> golang-1.19-go): the toolchain v1.20.2 is built and tested
# with. A newer Go first on PATH (the machine's Go 1.26, for the current control plane) is not
# used: v1.20's vendored tree predates it.
DEBIAN_GO_BIN="${DEBIAN_GO_BIN:-/usr/lib/go-1.19/bin}"

# kube_make SRC WHAT VERSION: build cmd WHAT offline from the vendored tree with Debian's Go;
# prints the binary.
kube_make() {
  local src="$1" what="$2" version="$3" bin
  is_exe "$DEBIAN_GO_BIN/go" || apt_install golang-1.19-go
  is_exe "$DEBIAN_GO_BIN/go" || die "no Debian Go at $DEBIAN_GO_BIN (package golang-1.19-go)"
  log "building $what ($("$DEBIAN_GO_BIN/go" version 2>/dev/null || echo 'go ?')); this takes minutes"
  (
    cd "$src"
    export PATH="$DEBIAN_GO_BIN:$PATH"
    export CGO_ENABLED=0 GOPROXY=off GOFLAGS=-mod=vendor GO111MODULE=on \
      GOCACHE="$BUILD_DIR/gocache" GOMODCACHE="$BUILD_DIR/gomodcache" GOTOOLCHAIN=local \
      KUBE_GIT_VERSION="$version" KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 \
      KUBE_GIT_TREE_STATE=clean
    make WHAT="$what" >&2
  ) || die "make WHAT=$what failed (see output above)"
  bin="$(find "$src/_output" -type f -name "$(basename "$what")" -perm -u+x | head -n1)"
  [[ -n "$bin" ]] || die "build finished but no $(basename "$what") binary under _output"
  printf '%s\n' "$bin"
}
