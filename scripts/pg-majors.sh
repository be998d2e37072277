#!/usr/bin/env bash
# QueueBox on the PostgreSQL majors besides Debian 12's 15 (issue 35):
#
#   scripts/pg-majors.sh [--build-only] [MAJOR...]
#                                      default: 16 17 18 (QB_PG_MAJORS)
#
# For each major:
#   1. a PostgreSQL of that major, built once per machine from Debian's
#      source package (upstream's tarball in it, Debian's patches not
#      applied) into $QB_PG_CACHE/<major>/install and reused while its stamp
#      is there (default cache /var/cache/queuebox-pg, outside the clone);
#   2. QueueBox built with warnings as errors against it (PG_CONFIG), the
#      extension installed into that prefix (the daemon into the copy);
#   3. the subset, as the postgres user in a copy of the tree: pg_regress,
#      the isolation specs, and TAP $QB_PG_TAP (delivery 001, retries 002,
#      the intake floor and parked at insert 024, routed at insert 026,
#      crash takeover 044, upgrade from a filled 0.3.4 054, the plans
#      made on empty tables 077: each major's planner); 15's Debian
#      binaries run the whole suite (scripts/test.sh).
#
# The source comes from Debian's archive, through apt with a private
# configuration (its own sources list, lists and cache in a temporary
# folder: the system's apt is left as it is), from the mirror the machine's
# own apt sources name, in the suites of QB_PG_SUITES (default: this
# release's backports, trixie, forky, sid).  A major whose source cannot be
# had is said loudly and skipped, and the others go on; it does not fail
# the run (16: no Debian suite has it; 17: trixie lists it, but the archive
# this project's machines reach answers 404 for its files; see
# docs/getting-started.md).  A build or a test that fails does.
#
# QB_PG_TAP names the TAP files; by hand, QB_PG_REGRESS and QB_PG_ISOLATION
# narrow the run to the pg_regress tests and isolation specs they name, and
# QB_PG_SOURCE_<major>=DIR builds that major from a source tree of one's own
# (a git checkout, an unpacked tarball; built outside it) instead of
# Debian's, when it is not in the cache yet.
#
# Needs root (the cache, and the copy chowned to postgres, as test.sh does),
# bison and flex (scripts/setup.sh).  One lock per major
# ($QB_PG_CACHE/<major>.lock) covers its build, the install into its prefix
# and the tests, so two runs on one machine do not mix their installs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

BUILD_ONLY=0
if [ "${1:-}" = --build-only ]; then BUILD_ONLY=1; shift; fi
MAJORS=${*:-${QB_PG_MAJORS-16 17 18}}
if [ "$(id -u)" -eq 0 ]; then
  CACHE=${QB_PG_CACHE:-/var/cache/queuebox-pg}
else
  CACHE=${QB_PG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/queuebox-pg}
fi
TAP=${QB_PG_TAP:-test/t/delivery/001_delivery.pl test/t/delivery/002_retry_dead.pl test/t/delivery/024_intake_floor.pl test/t/delivery/026_route_at_insert.pl test/t/faults/044_crash_takeover.pl test/t/upgrade/054_upgrade_0_3_4.pl test/t/delivery/077_plans_on_empty_tables.pl}
JOBS=${QB_PG_JOBS:-$(nproc)}
# what the build below is: a cache built by another recipe is rebuilt
RECIPE="1: upstream tarball; --enable-tap-tests --without-icu --without-readline --without-zlib; perl and isolation installed"
CONFIGURE=(--enable-tap-tests --without-icu --without-readline --without-zlib)

mkdir -p "$CACHE"
chmod 755 "$CACHE"
WORK=$(mktemp -d /tmp/queuebox-pgmajors.XXXXXX)
chmod 755 "$WORK"
KEEP=0
trap '[ $KEEP = 1 ] || rm -rf "$WORK"' EXIT
RUNAS=()
[ "$(id -u)" -eq 0 ] && RUNAS=(runuser -u postgres --)

say() { echo "== $*"; }
loud() {
  echo "!!"
  echo "!! $*"
  echo "!!"
}

# debian_mirror: "URI KEYRING" of the machine's Debian archive, from its apt
# sources (deb822 .sources files or one-line .list files): the first entry
# of the machine's own release (VERSION_CODENAME), which is the main archive
# (the security archive serves <codename>-security only)
debian_mirror() {
  local codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || return 1
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # one stanza a paragraph: print "URI KEYRING" of a stanza with the suite
    awk -v want="$codename" '
      function flush() {
        if (types ~ /deb/ && (" " suites " ") ~ (" " want " ") && uris != "")
          { split(uris, u, " "); print u[1], (key == "" ? "-" : key); found = 1; exit }
        types = ""; suites = ""; uris = ""; key = ""
      }
      /^[ \t]*$/ { flush(); next }
      /^#/ { next }
      tolower($1) == "types:" { $1 = ""; types = $0 }
      tolower($1) == "suites:" { $1 = ""; suites = $0 }
      tolower($1) == "uris:" { $1 = ""; uris = $0 }
      tolower($1) == "signed-by:" && $2 ~ /^\// { key = $2 }
      END { if (!found) flush() }' "$f"
  done | head -n 1 | grep . && return 0
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | sed -E 's/\[[^]]*\]//' \
    | awk -v want="$codename" '($1 == "deb" || $1 == "deb-src") && $3 == want { print $2, "-"; exit }' \
    | grep .
}

# apt_ready: the private apt configuration of this run in $WORK/apt (its
# own sources list, lists and cache), its index fetched once: deb-src
# lines for QB_PG_SUITES on the machine's Debian mirror; APT_O, the options
# that point apt-get and apt-cache there
APT_O=()
APT_SUITES=""
APT_MIRROR=""
apt_ready() {
  [ ${#APT_O[@]} -eq 0 ] || return 0
  local apt=$WORK/apt key codename s
  read -r APT_MIRROR key < <(debian_mirror) \
    || { echo "no Debian archive in this machine's apt sources" >&2; return 1; }
  [ "$key" != - ] || key=/usr/share/keyrings/debian-archive-keyring.gpg
  codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  APT_SUITES=${QB_PG_SUITES:-$codename-backports trixie forky sid}
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
  for s in $APT_SUITES; do
    echo "deb-src [signed-by=$key] $APT_MIRROR $s main"
  done > "$apt/sources.list"
  local o=(-o Dir::Etc::sourcelist="$apt/sources.list" -o Dir::Etc::sourceparts=/nonexistent
           -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache"
           -o APT::Sandbox::User=root -q)
  echo "reading the source indexes of $APT_MIRROR ($APT_SUITES)" >&2
  if ! apt-get "${o[@]}" update >"$apt/update.log" 2>&1; then
    cat "$apt/update.log" >&2
    echo "apt-get update failed" >&2
    return 1
  fi
  APT_O=("${o[@]}")
}

# fetch_source MAJOR DIR: upstream's tarball of postgresql-MAJOR from
# Debian's source package, unpacked in DIR (prints the folder); apt checks
# it against the archive's signed index
fetch_source() {
  local major=$1 dir=$2
  apt_ready || return 1
  if ! apt-cache "${APT_O[@]}" showsrc "postgresql-$major" 2>/dev/null | grep -q '^Package:'; then
    echo "no suite of $APT_MIRROR ($APT_SUITES) has a postgresql-$major source package" >&2
    return 1
  fi
  mkdir -p "$dir"
  echo "fetching postgresql-$major's source package" >&2
  (cd "$dir" && apt-get "${APT_O[@]}" source --download-only "postgresql-$major" >&2) \
    || { echo "apt-get source postgresql-$major failed: the index lists it, the archive did not serve it (above)" >&2; return 1; }
  local tarball
  tarball=$(ls "$dir"/postgresql-"$major"_*.orig.tar.* 2>/dev/null | head -n 1)
  [ -n "$tarball" ] || { echo "no upstream tarball in postgresql-$major's source package" >&2; return 1; }
  tar -xf "$tarball" -C "$dir" || { echo "cannot unpack $tarball" >&2; return 1; }
  ls -d "$dir"/postgresql-"$major".*/ | head -n 1
}

# build_pg MAJOR: the cached PostgreSQL of MAJOR, built when missing; 1
# when its source cannot be had, 2 when it does not build
build_pg() {
  local major=$1 dest=$CACHE/$1 stamp=$CACHE/$1/install/QUEUEBOX-STAMP
  if [ -f "$stamp" ] && [ "$(sed -n 2p "$stamp")" = "$RECIPE" ]; then
    say "PostgreSQL $major: cached in $dest/install ($(head -n 1 "$stamp"))"
    return 0
  fi
  rm -rf "$dest"
  mkdir -p "$dest"
  local src given=QB_PG_SOURCE_$major
  if [ -n "${!given:-}" ]; then
    # a source tree given by hand (a git checkout of REL_16_STABLE, an
    # unpacked tarball): built outside it, left as it is
    src=$(cd "${!given}" && pwd) && [ -x "$src/configure" ] \
      || { echo "$given=${!given}: no PostgreSQL source tree there" >&2; rm -rf "$dest"; return 1; }
    [ "$(sed -n "s/^PACKAGE_VERSION='\([0-9]*\).*/\1/p" "$src/configure")" = "$major" ] \
      || { echo "$given=${!given}: not PostgreSQL $major's source" >&2; rm -rf "$dest"; return 1; }
  else
    # the index once per run, here (fetch_source runs in a subshell)
    apt_ready || { rm -rf "$dest"; return 1; }
    src=$(fetch_source "$major" "$dest/fetch") || { rm -rf "$dest"; return 1; }
  fi
  local version
  version=$(sed -n "s/^PACKAGE_VERSION='\(.*\)'/\1/p" "$src/configure")
  say "PostgreSQL $major: building $version from $src into $dest/install (nice, $JOBS jobs)"
  local log=$dest/build.log
  mkdir -p "$dest/build"
  if ! ( cd "$dest/build" \
         && nice -n 10 "$src/configure" --prefix="$dest/install" "${CONFIGURE[@]}" \
         && nice -n 10 make -j"$JOBS" \
         && make install \
         && make -C src/test/perl install \
         && make -C src/test/isolation install ) >"$log" 2>&1; then
    tail -n 40 "$log"
    return 2
  fi
  printf 'PostgreSQL %s\n%s\n' "$version" "$RECIPE" > "$stamp"
  rm -rf "$dest/fetch" "$dest/build"
  return 0
}

# test_major MAJOR: build QueueBox against it, install, run the subset
test_major() {
  local major=$1 pgc=$CACHE/$1/install/bin/pg_config
  local dir=$WORK/pg$major
  cp -a "$ROOT/." "$dir"
  # what another major built: the extension's objects (the core, the
  # daemon and the helpers include no server header and are kept)
  rm -f "$dir"/src/pgext/*.o "$dir"/src/pgext/*.bc "$dir"/queuebox.so
  rm -rf "$dir"/tmp_check "$dir"/tmp_check_iso "$dir"/results "$dir"/output_iso
  say "PostgreSQL $major: QueueBox built with warnings as errors against $("$pgc" --version)"
  ( cd "$dir" && nice -n 10 make -s -j"$JOBS" PG_CONFIG="$pgc" all test/sink/qb_sink \
      && make -s PG_CONFIG="$pgc" DAEMON_PREFIX="$dir/daemon-install" install >/dev/null ) || return 1
  [ "$(id -u)" -eq 0 ] && chown -R postgres:postgres "$dir"
  say "PostgreSQL $major: pg_regress, isolation and TAP ${TAP//test\/t\//}"
  local narrow=()
  [ -n "${QB_PG_REGRESS+set}" ] && narrow+=(REGRESS="$QB_PG_REGRESS")
  [ -n "${QB_PG_ISOLATION+set}" ] && narrow+=(ISOLATION="$QB_PG_ISOLATION")
  if ! ( cd "$dir" && "${RUNAS[@]}" make -s PG_CONFIG="$pgc" installcheck PROVE_TESTS="$TAP" PROVE_FLAGS=--timer \
           "${narrow[@]}" ) \
      > "$dir/installcheck.out" 2>&1; then
    cat "$dir/installcheck.out"
    local f
    for f in "$dir"/regression.diffs "$dir"/output_iso/regression.diffs; do
      [ -f "$f" ] && { echo "---- $f"; cat "$f"; }
    done
    local n g
    for f in "$dir"/tmp_check/log/regress_log_*; do
      [ -f "$f" ] && grep -q 'not ok' "$f" || continue
      echo "---- $f (last 60 lines)"; tail -n 60 "$f"
      n=${f##*/regress_log_}
      for g in "$dir/tmp_check/log/${n}"_*.log; do
        [ -f "$g" ] && { echo "---- $g (last 80 lines)"; tail -n 80 "$g"; }
      done
    done
    KEEP=1
    echo "== PostgreSQL $major: the tree, its results and logs are kept in $dir"
    return 1
  fi
  grep -E '^(ok|not ok|#)|^(\[[0-9:]+\] )?test/t/|^All tests|^Files=|^Result' "$dir/installcheck.out" || true
}

summary=()
status=0
for major in $MAJORS; do
  t0=$SECONDS
  exec 9>"$CACHE/$major.lock"
  flock 9
  rc=0
  build_pg "$major" || rc=$?
  t1=$SECONDS
  if [ $rc -eq 1 ]; then
    loud "PostgreSQL $major: NOT TESTED: its source cannot be had here (above); the other majors go on"
    summary+=("PostgreSQL $major: NOT TESTED (no source: see above)")
    flock -u 9
    continue
  elif [ $rc -ne 0 ]; then
    loud "PostgreSQL $major: FAILED to build PostgreSQL ($CACHE/$major/build.log)"
    summary+=("PostgreSQL $major: FAILED (PostgreSQL build)")
    status=1
    flock -u 9
    continue
  fi
  if [ $BUILD_ONLY = 1 ]; then
    summary+=("PostgreSQL $major: built ($((t1 - t0))s)")
  elif test_major "$major"; then
    summary+=("PostgreSQL $major: passed (PostgreSQL build $((t1 - t0))s, QueueBox build and tests $((SECONDS - t1))s)")
  else
    loud "PostgreSQL $major: FAILED (QueueBox build or tests, above)"
    summary+=("PostgreSQL $major: FAILED (after $((SECONDS - t1))s)")
    status=1
  fi
  flock -u 9
done
if [ ${#summary[@]} -gt 0 ]; then
  say "majors:"
  printf '   %s\n' "${summary[@]}"
fi
exit $status
