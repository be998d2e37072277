#!/usr/bin/env bash
# scripts/embed-schema.sh: the daemon's schema of one database kind as C.
#
#   embed-schema.sh KIND VERSION UPGRADE_DIR PART...
#
# Writes to stdout a C file defining
#   const char qbd_schema_KIND[]          the PARTs, in order: a fresh install
#   const QbdUpgrade qbd_upgrades_KIND[]  one step per UPGRADE_DIR/FROM--TO.sql,
#                                         in version order, ended by {NULL}
# with @SCHEMA_VERSION@ replaced by VERSION; with QBD_STEP_DIR=DIR, a step's
# own DIR/FROM--TO.sql follows its shared one (the daemon-only DDL,
# sql/daemon/upgrade/); with QBD_STEP_TAIL=FILE, FILE ends every step
# (PostgreSQL's sql/schema/roles.sql).  The Makefile runs it for
# build/daemon/schema_pg.c and schema_mssql.c (docs/design/schema.md).
set -euo pipefail
kind=$1 version=$2 updir=$3
shift 3

cstring() { # the files as one C string literal, a line a line
	cat "$@" | sed "s/@SCHEMA_VERSION@/$version/g" |
		sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$/\\n"/'
}

echo "/* made by scripts/embed-schema.sh from $* and $updir: do not edit */"
echo '#include "qbd_backend.h"'
echo
echo "const char qbd_schema_$kind[] ="
cstring "$@"
echo ';'
echo
echo "const QbdUpgrade qbd_upgrades_$kind[] = {"
for f in $(ls "$updir"/*--*.sql 2>/dev/null | sort -V); do
	step=$(basename "$f" .sql)
	echo "	{.from = \"${step%%--*}\", .to = \"${step##*--}\", .sql ="
	own=""
	if [ -n "${QBD_STEP_DIR:-}" ] && [ -f "$QBD_STEP_DIR/$step.sql" ]; then
		own="$QBD_STEP_DIR/$step.sql"
	fi
	cstring "$f" $own ${QBD_STEP_TAIL:-}
	echo '	},'
done
echo '	{.from = NULL, .to = NULL, .sql = NULL}'
echo '};'
