# Sourced, not run: builds test binaries from Go modules once per version, cached outside the repo in
# ${EMBEDJOB_CACHE:-$HOME/.cache/embedjob}/bin/<name>-<version> (tests/envtest/setup for the control plane,
# tests/run for the integration tier's servers). Sourcing it takes the build lock for the rest of the
# sourcing shell: one build at a time on this machine; a second one (another clone's test run) waits and
# then finds the binary the first one built, instead of compiling the same packages beside it.
# Go's own build and module caches (GOCACHE, GOMODCACHE) are used as configured. Progress goes to stderr.

bindir="${EMBEDJOB_CACHE:-$HOME/.cache/embedjob}/bin"
mkdir -p "$bindir"
exec 9>"$bindir/.setup.lock"
flock 9

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
