#!/usr/bin/env bash
# The core's folders include downward only (the Makefile's COMMON_DIRS and
# README.md's layout say the order):
#
#   lib -> runtime -> broker -> config -> publish | source -> pgsql -> engine
#       -> admin -> hosts
#
# A file of src/common/<folder> may include its own folder's headers and
# those of a lower folder; never a higher folder's, never its peer's
# (publish and source), never a host's (src/pgext, src/daemon).  A quoted
# include is resolved as the compiler does: the including file's folder
# first, then the -I list (COMMON_DIRS) in order; so no header name may be
# in two folders either.  Prints every include that points up, with file,
# line and both folders; exits 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."

# lowest first; folders in one word are peers
LAYERS=(lib runtime broker config "publish source" pgsql engine admin)
ORDER="lib -> runtime -> broker -> config -> publish|source -> pgsql -> engine -> admin -> hosts"

declare -A rank
for i in "${!LAYERS[@]}"; do
  for d in ${LAYERS[$i]}; do rank[$d]=$i; done
done

# the compiler's -I list, in the Makefile's order
read -r -a incdirs <<<"$(sed -n 's/^COMMON_DIRS *= *//p' Makefile)"

bad=0
fail() { echo "check-includes: $*" >&2; bad=1; }

# every folder of the core has a place in the order and on the -I list
for dir in src/common/*/; do
  d=$(basename "$dir")
  [ -n "${rank[$d]:-}" ] || fail "src/common/$d/ has no place in LAYERS (scripts/check-includes.sh)"
  [[ " ${incdirs[*]} " == *" $d "* ]] || fail "src/common/$d/ is not in the Makefile's COMMON_DIRS"
done
# a name in two folders: the -I list would pick one for every includer
while read -r n; do
  fail "$(find src/common -name "$n" | sort | tr '\n' ' ')have one name; rename one"
done < <(find src/common -name '*.h' -printf '%f\n' | sort | uniq -d)

while IFS= read -r f; do
  from=${f#src/common/}; from=${from%%/*}
  lineno=0
  while IFS= read -r line; do
    lineno=$((lineno + 1))
    [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]] || continue
    inc=${BASH_REMATCH[1]}
    found=""
    for cand in "$(dirname "$f")/$inc" "${incdirs[@]/#/src/common/}"; do
      [ "$cand" = "$(dirname "$f")/$inc" ] || cand="$cand/$inc"
      if [ -f "$cand" ]; then found=$(realpath -m --relative-to=. "$cand"); break; fi
    done
    where="$f:$lineno: #include \"$inc\""
    if [ -z "$found" ]; then
      host=$(find src/pgext src/daemon -name "$(basename "$inc")" -print -quit 2>/dev/null || true)
      if [ -n "$host" ]; then
        fail "$where: $from/ includes a host's header ($host); the core includes no host"
      else
        fail "$where: not found in $(dirname "$f")/ nor on the -I list (COMMON_DIRS)"
      fi
      continue
    fi
    case $found in
      src/common/*/*) ;;
      *) fail "$where: $from/ includes $found, outside src/common; the core includes no host"; continue ;;
    esac
    to=${found#src/common/}; to=${to%%/*}
    [ "$to" = "$from" ] && continue
    # a folder with no place in the order is reported above
    [ -n "${rank[$to]:-}" ] && [ -n "${rank[$from]:-}" ] || continue
    if [ "${rank[$to]}" -gt "${rank[$from]}" ]; then
      fail "$where: $from/ includes $found of $to/, a higher folder"
    elif [ "${rank[$to]}" -eq "${rank[$from]}" ]; then
      fail "$where: $from/ includes $found of $to/, its peer"
    fi
  done <"$f"
done < <(find src/common -name '*.[ch]' | sort)

if [ "$bad" = 0 ]; then
  echo "check-includes: src/common includes downward only ($ORDER)"
else
  echo "check-includes: the order is $ORDER; move what the lower folder needs down (Makefile, COMMON_DIRS)" >&2
fi
exit "$bad"
