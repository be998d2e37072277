#!/usr/bin/env bash
# One prefix per module: src/README.md's table names each module's files and
# its prefixes.  Every function head in src/ (.c and .h, static or not) is
# named qb_<what>_... (public, everyone's: not judged here) or with a prefix
# (qbx_...) of the module its file belongs to.  Errors: a function whose
# prefix is another module's, a qb..._ prefix no row lists, a file no row
# holds, a prefix two rows list.  A name with no qb prefix is a note.
#
#   scripts/check-prefixes.sh            exit 1 on an error (scripts/test.sh)
#   scripts/check-prefixes.sh --report   print the same, exit 0
set -euo pipefail
cd "$(dirname "$0")/.."

mode=enforce
[ "${1:-}" = "--report" ] && mode=report

# the table: "module<TAB>files<TAB>prefixes", files and prefixes space-separated
table=$(awk -F'|' '
	/<!-- prefixes/ { on = 1; next }
	/<!-- \/prefixes/ { on = 0 }
	!on || NF < 5 || $2 ~ /^ *(Module|---)/ { next }
	{
		mod = $2; gsub(/^ +| +$/, "", mod)
		files = ""; s = $3
		while (match(s, /`[^`]+`/)) { files = files " " substr(s, RSTART + 1, RLENGTH - 2); s = substr(s, RSTART + RLENGTH) }
		prefixes = ""; s = $4
		while (match(s, /`[^`]+`/)) { prefixes = prefixes " " substr(s, RSTART + 1, RLENGTH - 2); s = substr(s, RSTART + RLENGTH) }
		print mod "\t" files "\t" prefixes
	}' src/README.md)
[ -n "$table" ] || { echo "check-prefixes: no table between <!-- prefixes --> marks in src/README.md" >&2; exit 1; }

# every function head: the name at column 0 (PostgreSQL style), or a
# one-line "static T name(" head; a line with ';' is a prototype
heads() {
	awk '
	/^[a-z_][A-Za-z0-9_]*\(/ && !/;[[:space:]]*$/ {
		n = $0; sub(/\(.*/, "", n); print FILENAME "\t" FNR "\t" n; next
	}
	/^(static[[:space:]]+)?(inline[[:space:]]+)?(const[[:space:]]+)?[A-Za-z_][A-Za-z0-9_]*[[:space:]*]+[a-z_][A-Za-z0-9_]*\(/ && !/;/ && !/^(typedef|return|extern)/ {
		n = $0; sub(/\(.*/, "", n); sub(/.*[[:space:]*]/, "", n); print FILENAME "\t" FNR "\t" n
	}' "$@"
}

# the check proper, in awk: the table, then the heads (a file with none is
# no module's business)
out=$( { printf '%s\n' "$table"; echo "--"; heads $(find src -name '*.[ch]' | sort); } | awk -F'\t' '
	function module_of(path,    rel, base, best, bestlen, i, e, n, len) {
		rel = path; sub(/^src\//, "", rel)
		base = rel; sub(/.*\//, "", base)
		best = ""; bestlen = -1
		for (i = 1; i <= nentries; i++) {
			e = entry[i]; len = -1
			if (e ~ /\/$/) { if (index(rel, e) == 1) len = length(e) }
			else if (e ~ /\*/) { n = e; gsub(/\./, "\\.", n); gsub(/\*/, ".*", n); if (base ~ ("^" n "$")) len = 1000 }
			else if (e ~ /\//) { if (rel == e) len = 2000 }
			else if (base == e || (e ~ /\.c$/ && (base == substr(e, 1, length(e) - 2) ".h" ||
											   base == substr(e, 1, length(e) - 2) "_int.h"))) len = 2000
			if (len > bestlen) { bestlen = len; best = entrymod[i] }
		}
		return best
	}
	section == 0 && $0 == "--" { section = 1; next }
	section == 0 {
		nf = split($2, f, " "); for (i = 1; i <= nf; i++) { nentries++; entry[nentries] = f[i]; entrymod[nentries] = $1 }
		np = split($3, p, " ")
		for (i = 1; i <= np; i++) {
			if (p[i] in owner && owner[p[i]] != $1)
				print "ERROR\ttable\tthe prefix " p[i] " is listed for " owner[p[i]] " and for " $1
			owner[p[i]] = $1
		}
		next
	}
	{
		file = $1; line = $2; name = $3
		if (!(file in mod)) {
			mod[file] = module_of(file)
			if (mod[file] == "") print "ERROR\t" file "\tno module in src/README.md holds this file; add it to a row"
		}
		if (mod[file] == "" || name ~ /^_/) next
		if (name ~ /^qb_/) { public++; next }
		if (name !~ /^qb[a-z0-9]*_/) {
			if (name != "main") print "NOTE\t" file ":" line "\t" name " has no qb prefix (" mod[file] ")"
			next
		}
		pre = name; sub(/_.*/, "_", pre)
		checked++
		if (!(pre in owner))
			print "ERROR\t" file ":" line "\t" name ": the prefix " pre " is in no row of src/README.md (module " mod[file] ")"
		else if (owner[pre] != mod[file])
			print "ERROR\t" file ":" line "\t" name ": " pre " is the prefix of " owner[pre] "; this file is " mod[file]
	}
	END { print "COUNT\t" checked + 0 "\t" public + 0 }') 

count=$(printf '%s\n' "$out" | awk -F'\t' '$1 == "COUNT" { print $2 " with a module prefix, " $3 " public qb_ names" }')
nerr=$(printf '%s\n' "$out" | grep -c '^ERROR' || true)
printf '%s\n' "$out" | awk -F'\t' '$1 == "NOTE" { print "check-prefixes: note: " $2 ": " $3 }'
printf '%s\n' "$out" | awk -F'\t' '$1 == "ERROR" { print "check-prefixes: " $2 ": " $3 }' >&2
if [ "$nerr" = 0 ]; then
	echo "check-prefixes: one prefix per module ($count; src/README.md)"
	exit 0
fi
echo "check-prefixes: $nerr functions or files off src/README.md's table ($count)" >&2
if [ "$mode" = report ]; then
	echo "check-prefixes: report mode (--report): not failing" >&2
	exit 0
fi
exit 1
