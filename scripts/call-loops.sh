#!/bin/sh
# call-loops.sh BUILD_DIR: no two source files call each other in a loop, directly or through a chain
# (DESIGN.md: dependencies point down only). From the built objects: an edge A -> B wherever A.o uses a
# symbol B.o defines (functions and data alike); tsort refuses any cycle and names its files.
# First a planted loop (two files calling each other) must be caught, so the check is known to work.
set -eu
build=${1:?usage: call-loops.sh BUILD_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# edges OBJECT_FILES...: "user definer" pairs, one per line, named by source file
edges() {
    nm -A --defined-only "$@" 2>/dev/null | awk '$2 ~ /^[TDRBCVW]$/ {n = split($1, p, ":"); f = p[n - 1]; sub(/\.o$/, "", f); print $3, f}' \
        | sort -u >"$tmp/defs"
    nm -A -u "$@" 2>/dev/null | awk '{n = split($1, p, ":"); f = p[n - 1]; sub(/\.o$/, "", f); print $NF, f}' | sort -u >"$tmp/uses"
    join "$tmp/uses" "$tmp/defs" | awk '$2 != $3 {print $2, $3}' | sort -u
}

# the control: a.c and b.c call each other
printf 'void b(void);\nvoid a(void) { b(); }\n' >"$tmp/a.c"
printf 'void a(void);\nvoid b(void) { a(); }\n' >"$tmp/b.c"
cc -c -o "$tmp/a.o" "$tmp/a.c" && cc -c -o "$tmp/b.o" "$tmp/b.c"
if edges "$tmp/a.o" "$tmp/b.o" | tsort >/dev/null 2>&1; then
    echo "call-loops: the planted loop a.c <-> b.c was not caught; the check is broken" >&2
    exit 1
fi

objs=$(find "$build" -name '*.o' -path '*CMakeFiles/kp_*' ; find "$build" -name 'main.c.o' -path '*CMakeFiles/kparity.dir*')
[ -n "$objs" ] || { echo "call-loops: no objects under $build/CMakeFiles (build first)" >&2; exit 2; }
# shellcheck disable=SC2086
edges $objs >"$tmp/edges"
if ! tsort "$tmp/edges" >/dev/null 2>"$tmp/loops"; then
    echo "call-loops: source files call each other in a loop:" >&2
    cat "$tmp/loops" >&2
    exit 1
fi
echo "call-loops: $(wc -l <"$tmp/edges") calls between $(echo $objs | wc -w) source files, no loop"
