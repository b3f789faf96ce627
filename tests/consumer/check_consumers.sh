#!/usr/bin/env bash
# Builds a program against ddheap the two ways a user would: from an
# installation through pkg-config, and as a meson subproject with
# dependency('ddheap') falling back to it. Both must build and sample.
# Usage: check_consumers.sh SOURCE_ROOT BUILD_DIR_OF_DDHEAP
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
result() { if [ "$1" = 0 ]; then passed=$((passed+1)); echo "ok     $2"; else failed=$((failed+1)); echo "FAILED $2"; fi; }

# 1. meson install into a staging root, then pkg-config.
prefix=$(meson introspect --buildoptions "$build" | python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
meson install -C "$build" --destdir "$work/root" --no-rebuild >/dev/null
pcdir=$(dirname "$(find "$work/root" -name ddheap.pc | head -1)")
export PKG_CONFIG_SYSROOT_DIR="$work/root" PKG_CONFIG_PATH="$pcdir"
rc=0
cc -std=c11 $(pkg-config --cflags ddheap) "$src/tests/consumer/consumer.c" -o "$work/consumer-pc" \
   $(pkg-config --libs ddheap) && "$work/consumer-pc" || rc=$?
result $rc "installed headers + libddheap.a + ddheap.pc (prefix $prefix)"
for h in ddheap.h ddheap/fastpath.h ddheap/coldpath.h ddheap/testing.h ddheap/config.h; do
  test -f "$work/root$prefix/include/$h"; result $? "installed include/$h"
done
unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH
# The interposer (docs/interpose.md): the library in libdir, ddheap-run in
# bindir naming that installed path, the bpftrace scripts beside it; the
# installed ddheap-run runs a program with the installed library.
libdir=$(meson introspect --buildoptions "$build" | python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="libdir"))')
preload="$prefix/$libdir/libddheap_preload.so"
test -f "$work/root$preload"; result $? "installed $libdir/libddheap_preload.so"
test -x "$work/root$prefix/bin/ddheap-run" && grep -q "$preload" "$work/root$prefix/bin/ddheap-run"
result $? "installed bin/ddheap-run, naming $preload"
for s in ddheap-alloc.bt ddheap-live.bt ddheap-events.bt ddheap-fold; do
  test -f "$work/root$prefix/share/ddheap/$s"; result $? "installed share/ddheap/$s"
done
rc=0
out=$(DDHEAP_PRELOAD_LIB="$work/root$preload" "$work/root$prefix/bin/ddheap-run" sh -c 'echo "$LD_PRELOAD"' 2>/dev/null) &&
  [ "$out" = "$work/root$preload" ] || rc=1
result $rc "installed ddheap-run preloads the library"

# 2. As a subproject (a copy of the tracked sources, no build dirs).
mkdir -p "$work/proj/subprojects/ddheap"
cp -r "$src/tests/consumer/"{meson.build,consumer.c} "$work/proj/"
(cd "$src" && git ls-files -z 2>/dev/null || find . -path ./build\* -prune -o -type f -print0) |
  (cd "$src" && xargs -0 cp --parents -t "$work/proj/subprojects/ddheap")
rc=0
(meson setup "$work/proj/build" "$work/proj" -Dddheap:tests=false -Dddheap:bench=false -Dddheap:examples=false >/dev/null &&
 meson compile -C "$work/proj/build" >/dev/null && "$work/proj/build/consumer") || rc=$?
result $rc "meson subproject with dependency('ddheap') fallback"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
