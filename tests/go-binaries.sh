# Sourced, not run: builds test binaries from Go modules once per version, cached outside the repo in
# ${EMBEDJOB_CACHE:-$HOME/.cache/embedjob}/bin/<name>-<version> (tests/envtest/setup for the control plane,
# tests/run for the integration tier's servers). The build lock (hold_build_lock) is taken by the first thing
# the sourcing shell must make, and kept for the rest of it: one maker at a time on this machine; a second one
# (another clone's test run) waits and then finds what the first one made, instead of compiling the same
# packages beside it. A run that finds everything made never waits, not even on another run's builds.
# Go's own build and module caches (GOCACHE, GOMODCACHE) are used as configured. Progress goes to stderr.

bindir="${EMBEDJOB_CACHE:-$HOME/.cache/embedjob}/bin"
mkdir -p "$bindir"
exec 9>"$bindir/.setup.lock"
hold_build_lock() { flock 9; }

log() { printf '%s: %s\n' "$(basename "$(dirname "$0")")/$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v go >/dev/null || die "go is not on PATH (Go 1.26+ is needed)"

# build NAME VERSION MODULE_DIR PACKAGE [EXTRA_LDFLAGS]: $bindir/NAME-VERSION unless it is there. MODULE_DIR
# holds the committed go.mod/go.sum that require PACKAGE's module (`go build -mod=readonly` there: they are the
# recipe, never edited here); MODULE_DIR "-" is `go install PACKAGE@VERSION`, by the module's own go.mod and
# go.sum, checked against Go's checksum database.
build() {
  local name="$1" version="$2" dir="$3" pkg="$4" ldflags="-s -w ${5:-}"
  local out="$bindir/$name-$version"
  [[ -x "$out" ]] || hold_build_lock  # then look again: the run that held it may have built it
  if [[ -x "$out" ]]; then
    log "$name $version: cached ($out)"
    return
  fi
  log "$name $version: building $pkg (a first build takes minutes) ..."
  local start=$SECONDS tmp="$out.tmp.$$"
  if [[ "$dir" = - ]]; then
    if ! (mkdir -p "$tmp.d" && GOBIN="$tmp.d" go install -trimpath -ldflags="$ldflags" "$pkg@$version" &&
          mv -f "$tmp.d/${pkg##*/}" "$tmp") >&2; then
      rm -rf "$tmp" "$tmp.d"
      die "building $name failed"
    fi
    rm -rf "$tmp.d"
  elif ! (cd "$dir" && go build -mod=readonly -trimpath -ldflags="$ldflags" -o "$tmp" "$pkg") >&2; then
    rm -f "$tmp"
    die "building $name failed"
  fi
  mv -f "$tmp" "$out"
  log "$name $version: built in $((SECONDS - start))s -> $out"
}
