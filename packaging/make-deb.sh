#!/usr/bin/env bash
# packaging/make-deb.sh VERSION: what `make deb` runs.  The Debian packages
# of debian/ into build/deb/:
#   postgresql-NN-queuebox_VERSION_ARCH.deb   for each PostgreSQL major with a
#                                             server-dev package here (debian/pgversions)
#   queuebox-daemon_VERSION_ARCH.deb
# (with their -dbgsym packages, the .buildinfo and the .changes), then
# lintian on them (LINTIAN=no skips it; a tag that is neither fixed nor
# overridden with its reason in debian/*.lintian-overrides fails).
#
# dpkg-buildpackage runs on a copy of the repository's files in
# build/deb-src/: those git knows (committed, staged, or new and not
# ignored), as they are in the working tree, so no build output of this
# tree goes in, and this tree's own build is left alone.  Outside a git
# checkout (a release tarball) it copies the tree less build/.
# Needs what scripts/setup.sh installs (debhelper, postgresql-server-dev-all,
# lintian, and the build's libraries).  DEB_JOBS=N: parallel jobs (2).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: packaging/make-deb.sh VERSION, the Makefile EXTVERSION}

missing=()
for tool in dpkg-buildpackage dh pg_buildext; do
	command -v "$tool" >/dev/null || missing+=("$tool")
done
[ -e /usr/share/perl5/Debian/Debhelper/Buildsystem/pgxs.pm ] || missing+=(postgresql-server-dev-all)
if [ "${LINTIAN:-yes}" != no ] && ! command -v lintian >/dev/null; then missing+=(lintian); fi
if [ ${#missing[@]} -gt 0 ]; then
	echo "make deb: ${missing[*]} not found: run scripts/setup.sh (debhelper, postgresql-server-dev-all, lintian)" >&2
	exit 1
fi
changelog=$(dpkg-parsechangelog -l debian/changelog -S Version)
if [ "$changelog" != "$version" ]; then
	echo "make deb: debian/changelog is at $changelog and the Makefile's EXTVERSION at $version: add an entry for $version at the top of debian/changelog" >&2
	exit 1
fi

src=build/deb-src
stage=$src/queuebox-$version
out=build/deb
rm -rf "$src" "$out"
mkdir -p "$stage" "$out"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	# a file deleted in the working tree but not in the index is left out
	git ls-files -z --cached --others --exclude-standard |
		while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
		tar --null -T - -cf - | tar -xf - -C "$stage"
else
	tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C "$stage"
fi

# debian/control for the majors found here, then the packages (binary
# only, unsigned: they are for this machine and its like)
( cd "$stage" && pg_buildext updatecontrol && dpkg-buildpackage -b -us -uc -j"${DEB_JOBS:-2}" ) \
	> "$src/build.log" 2>&1 || {
	tail -n 60 "$src/build.log" >&2
	echo "make deb: dpkg-buildpackage failed; the whole log: $src/build.log" >&2
	exit 1
}
mv "$src"/*.deb "$src"/*.buildinfo "$src"/*.changes "$out"/ 2>/dev/null || true
ls "$out"/*.deb >/dev/null 2>&1 || { echo "make deb: no package was built; see $src/build.log" >&2; exit 1; }

if [ "${LINTIAN:-yes}" != no ]; then
	# the packages one installs (not the -dbgsym ones, nor the .changes,
	# which take no overrides: their only tag is the Maintainer's address,
	# as in debian/*.lintian-overrides), every tag down to pedantic
	debs=$(ls "$out"/*.deb | grep -v -- '-dbgsym_')
	lintian --fail-on error,warning,info,pedantic --display-info --pedantic --info $debs
	echo "make deb: lintian: no tag left but those debian/*.lintian-overrides justify:"
	lintian --display-info --pedantic --show-overrides $debs | grep '^O:' || true
fi
ls -l "$out"
