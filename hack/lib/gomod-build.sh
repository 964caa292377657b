# Shared by the hack/ scripts that build Go binaries from the Go module proxy through a
# wrapper module of ours (hack/gomod/<name>/go.mod + go.sum): kube-1.37.sh, helm.sh.
#
# Sourced, never run. The caller sets PROG (its name, for messages) before sourcing.
#
# Invariants:
#   - the wrapper's go.mod/go.sum are the source of truth: builds run with -mod=readonly, so a
#     build never edits them, and a dependency missing from go.sum is an error, not a download
#     of whatever is newest;
#   - a cache directory holds finished binaries only: each binary is linked to a temp name in
#     the same directory and renamed into place after it answers --version, and the stamp
#     (written last, atomically) names the recipe that produced them; no stamp or another
#     recipe means "rebuild";
#   - one builder per cache directory (flock on DIR/.lock); callers that find a valid stamp
#     never take the lock.
# Builds are polite to a shared machine: nice 19, GOMAXPROCS=2, `go build -p 1`, one binary
# at a time. Go's own build and module caches are the user's, so a rebuild after a recipe
# change recompiles only what changed.
# shellcheck shell=bash

# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

GOMOD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../gomod" && pwd)"
CACHE_ROOT="$(abspath "${KOORD_CACHE_DIR:-${HOME:-/root}/.cache/koord-py}")"

# gomod_go MODDIR: prints the go command to use (env GO, else `go` on PATH) after checking it
# is at least the wrapper's `go` directive (GOTOOLCHAIN=local: no toolchain download).
gomod_go() {
  local moddir="$1" go="${GO:-go}" want have
  command -v "$go" >/dev/null 2>&1 || die "no Go toolchain ('$go' not found); install Go or set GO=/path/to/go"
  want="$(awk '$1 == "go" { print $2; exit }' "$moddir/go.mod")"
  [[ -n "$want" ]] || die "$moddir/go.mod has no go directive"
  have="$(GOTOOLCHAIN=local "$go" env GOVERSION 2>/dev/null)" || die "'$go env GOVERSION' failed"
  have="${have#go}"
  have="${have%%[-+ ]*}"
  if [[ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" != "$want" ]]; then
    die "needs Go >= $want for $(basename "$moddir") (found go$have at $(command -v "$go")); set GO=/path/to/go"
  fi
  command -v "$go"
}

# gomod_recipe_key MODDIR... -- TEXT: a hash of the wrappers' go.mod/go.sum and TEXT (the build
# flags and versions), naming what a cache directory's binaries were built from.
gomod_recipe_key() {
  local d files=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do
    d="$1"; shift
    [[ -f "$d/go.mod" && -f "$d/go.sum" ]] || die "wrapper module $d lacks go.mod or go.sum"
    files+=("$d/go.mod" "$d/go.sum")
  done
  shift
  { cat "${files[@]}"; printf '%s\n' "$@"; } | sha256sum | cut -d' ' -f1
}

# gomod_stamp_ok DIR KEY BIN...: true when DIR/stamp names KEY and every BIN is executable.
gomod_stamp_ok() {
  local dir="$1" key="$2" b
  shift 2
  [[ -f "$dir/stamp" ]] || return 1
  [[ "$(sed -n 's/^recipe=//p' "$dir/stamp")" == "$key" ]] || return 1
  for b in "$@"; do is_exe "$dir/$b" || return 1; done
}

# gomod_lock DIR: create DIR and take its build lock (fd 9) for the rest of the process.
gomod_lock() {
  local dir="$1"
  mkdir -p "$dir" || die "cannot create cache dir $dir"
  exec 9>"$dir/.lock" || die "cannot open lock file $dir/.lock"
  if ! flock -n 9; then
    log "another caller holds $dir/.lock (building?); waiting for it"
    flock 9 || die "cannot take lock $dir/.lock"
  fi
}

GOMOD_TMP_FILES=()
gomod_cleanup() {
  local f
  for f in "${GOMOD_TMP_FILES[@]}"; do rm -f "$f"; done
  GOMOD_TMP_FILES=()
}

# gomod_begin_build DIR: under the lock, forget the old stamp (a rebuild that dies half-way
# must not leave a stamp naming binaries it replaced) and remove temp files an earlier,
# killed build left behind.
gomod_begin_build() {
  local dir="$1"
  rm -f "$dir/stamp" "$dir"/.*.tmp.* 2>/dev/null || true
}

# gomod_build MODDIR PKG DEST TAGS LDFLAGS: `go build` PKG (a package of the wrapper's build
# list) CGO-free into DEST via a temp file in DEST's directory; logs the wall time.
# Sets GOMOD_BUILT to the temp file; the caller checks it (--version) and then calls
# gomod_install "$GOMOD_BUILT" DEST. Not for $(...): the temp file must stay registered in
# this shell's GOMOD_TMP_FILES, which the caller's EXIT trap (gomod_cleanup) removes.
GOMOD_BUILT=""
gomod_build() {
  local moddir="$1" pkg="$2" dest="$3" tags="$4" ldflags="$5" go tmp start
  go="$(gomod_go "$moddir")"
  tmp="$(mktemp "$(dirname "$dest")/.$(basename "$dest").tmp.XXXXXX")" \
    || die "cannot create a temp file beside $dest"
  GOMOD_TMP_FILES+=("$tmp")
  log "building $pkg ($("$go" env GOVERSION), wrapper $(basename "$moddir")); this can take many minutes"
  start="$(date +%s)"
  (
    cd "$moddir"
    # -buildvcs=false: the wrapper sits in our git checkout, whose state says nothing about
    # the binary (and git may be absent or refuse a checkout owned by another user).
    export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOTOOLCHAIN=local GOMAXPROCS=2 GOWORK=off
    nice -n 19 "$go" build -p 1 -trimpath -tags="$tags" -ldflags="$ldflags" -o "$tmp" "$pkg" >&2
  ) || die "go build $pkg failed (see output above)"
  is_exe "$tmp" || die "go build $pkg produced no executable"
  log "built $(basename "$dest") in $(($(date +%s) - start)) s"
  GOMOD_BUILT="$tmp"
}

# gomod_install TMP DEST: rename a checked temp binary into place (atomic, same directory).
gomod_install() {
  mv -f "$1" "$2" || die "cannot move the binary into place at $2"
}

# gomod_write_stamp DIR KEY TEXT...: the stamp, written last and atomically.
gomod_write_stamp() {
  local dir="$1" key="$2" tmp
  shift 2
  tmp="$(mktemp "$dir/.stamp.tmp.XXXXXX")" || die "cannot write the stamp in $dir"
  GOMOD_TMP_FILES+=("$tmp")
  {
    printf 'recipe=%s\n' "$key"
    printf 'built=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    printf '%s\n' "$@"
  } >"$tmp" || die "cannot write the stamp in $dir"
  chmod 0644 "$tmp" && mv -f "$tmp" "$dir/stamp" || die "cannot write the stamp in $dir"
}
