#!/usr/bin/env bash
# scripts/embed-console.sh: the console's static files as C.
#
#   embed-console.sh FILE...
#
# Writes to stdout a C file defining qb_console_assets[] (qb_console.h):
# each FILE as one string literal, under the path /console/<name>
# (index.html under /console itself), with its content type by extension,
# ended by {NULL}.  The Makefile runs it for build/console/qb_console_assets.c;
# no network, no tool beyond sed.
set -euo pipefail

echo "/* made by scripts/embed-console.sh from $*: do not edit */"
echo '#include "qb_console.h"'
echo
echo 'const QbConsoleAsset qb_console_assets[] = {'
for f in "$@"; do
	name=$(basename "$f")
	case $name in
		index.html) path=/console ;;
		*) path=/console/$name ;;
	esac
	case $name in
		*.html) type='text/html; charset=utf-8' ;;
		*.js) type='text/javascript; charset=utf-8' ;;
		*.css) type='text/css; charset=utf-8' ;;
		*.svg) type='image/svg+xml' ;;
		*) echo "embed-console.sh: $f: no content type for this extension" >&2; exit 1 ;;
	esac
	echo "	{\"$path\", \"$type\","
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/\t\t"/' -e 's/$/\\n"/' "$f"
	echo '	},'
done
echo '	{NULL, NULL, NULL}'
echo '};'
