#!/usr/bin/env bash
# Builds a program against ddheap the two ways a user would: from an
# installation through pkg-config, and as a meson subproject with
# dependency('ddheap') falling back to it. Both must build and sample.
# The installation must also hold the tools the README runs, and they must
# run from there.
#
# The consumer is built with the build's C compiler and sanitizer
# (CONSUMER_CC, CONSUMER_SANITIZE, CONSUMER_LUNDEF, set by meson from
# cc.cmd_array(), b_sanitize and b_lundef): a sanitized libddheap.a links
# only into a program built with the same runtime.
#
# Usage: check_consumers.sh [--bpftrace] SOURCE_ROOT BUILD_DIR_OF_DDHEAP
#   --bpftrace  (suite 'tracer', root) only the installation, and every
#               installed bpftrace script parsed and compiled against the
#               installed consumer by `bpftrace -d` (a dry run: nothing is
#               attached). Fails, never skips, without root or bpftrace.
set -euo pipefail
with_bpftrace=0
if [ "${1:-}" = --bpftrace ]; then with_bpftrace=1; shift; fi
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
read -r -a cc <<<"${CONSUMER_CC:-cc}"
sanitize=${CONSUMER_SANITIZE:-none}
lundef=${CONSUMER_LUNDEF:-true}
san_flags=()
if [ "$sanitize" != none ]; then
  san_flags=("-fsanitize=$sanitize")
  echo "note   consumers built with ${cc[*]} -fsanitize=$sanitize, as the library"
fi
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
# shellcheck disable=SC2046
"${cc[@]}" -std=c11 "${san_flags[@]}" $(pkg-config --cflags ddheap) "$src/tests/consumer/consumer.c" \
   -o "$work/consumer-pc" $(pkg-config --libs ddheap) && "$work/consumer-pc" || rc=$?
result $rc "installed headers + libddheap.a + ddheap.pc (prefix $prefix)"
for h in ddheap.h ddheap/fastpath.h ddheap/coldpath.h ddheap/testing.h ddheap/config.h; do
  test -f "$work/root$prefix/include/$h"; result $? "installed include/$h"
done
unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH
# The interposer (docs/interpose.md): the library in libdir, ddheap-run in
# bindir naming that installed path and the installed scripts; the
# installed ddheap-run runs a program with the installed library.
libdir=$(meson introspect --buildoptions "$build" | python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="libdir"))')
preload="$prefix/$libdir/libddheap_preload.so"
test -f "$work/root$preload"; result $? "installed $libdir/libddheap_preload.so"
test -x "$work/root$prefix/bin/ddheap-run" && grep -q "$preload" "$work/root$prefix/bin/ddheap-run"
result $? "installed bin/ddheap-run, naming $preload"
# Its helper, which reads the program's dynamic symbols before exec.
libexecdir=$(meson introspect --buildoptions "$build" | python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="libexecdir"))')
run_check="$prefix/$libexecdir/ddheap-run-check"
test -x "$work/root$run_check" && grep -q "$run_check" "$work/root$prefix/bin/ddheap-run"
result $? "installed $libexecdir/ddheap-run-check, named by ddheap-run"
# The agent ddheap-prof -p injects (docs/attach.md), beside it; the
# installed ddheap-prof (where built) names both installed libraries.
agent="$prefix/$libdir/libddheap_agent.so"
test -f "$work/root$agent"; result $? "installed $libdir/libddheap_agent.so"
if [ -e "$work/root$prefix/bin/ddheap-prof" ]; then
  grep -q -a "$preload" "$work/root$prefix/bin/ddheap-prof" &&
    grep -q -a "$agent" "$work/root$prefix/bin/ddheap-prof"
  result $? "installed bin/ddheap-prof, naming $preload and $agent"
fi
# The bpftrace line it prints (before it runs the command) names the
# installed ddheap-live.bt.
script=$({ DDHEAP_PRELOAD_LIB="$work/root$preload" "$work/root$prefix/bin/ddheap-run" true 2>&1 >/dev/null ||
           true; } | sed -n 's/^ddheap-run: bpftrace \([^ ]*\) .*/\1/p')
test -n "$script" && test -x "$work/root$script"
result $? "installed ddheap-run names the installed script ${script:-(none)}"
if [ "$sanitize" != none ]; then
  # A sanitized libddheap_preload.so cannot be preloaded into a program
  # built without the sanitizer's runtime (sh here): the native stage runs
  # this check.
  echo "note   installed ddheap-run not run with the library: this build is -fsanitize=$sanitize"
else
  rc=0
  out=$(DDHEAP_PRELOAD_LIB="$work/root$preload" DDHEAP_RUN_CHECK="$work/root$run_check" \
        "$work/root$prefix/bin/ddheap-run" sh -c 'echo "$LD_PRELOAD"' 2>/dev/null) &&
    [ "$out" = "$work/root$preload" ] || rc=1
  result $rc "installed ddheap-run preloads the library"
fi

# The tools, where tools/meson.build puts them, executable, with their
# interpreter line.
option() {
  meson introspect --buildoptions "$build" |
    python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]==sys.argv[1]))' "$1"
}
under() { case $1 in /*) echo "$work/root$1" ;; *) echo "$work/root$prefix/$1" ;; esac; }
sbin=$(under "$(option sbindir)") bin=$(under "$(option bindir)")
for t in "$sbin/ddheap-live.bt" "$sbin/ddheap-alloc.bt" "$sbin/ddheap-events.bt" "$bin/ddheap-fold"; do
  want='#!/usr/bin/env bpftrace'
  case $t in *fold) want='#!/usr/bin/awk -f' ;; esac
  test -x "$t" && [ "$(head -1 "$t")" = "$want" ]
  result $? "installed ${t#"$work/root"}, executable, $want"
done

if [ $with_bpftrace = 1 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v bpftrace >/dev/null; then
    echo "FAILED --bpftrace needs root and bpftrace (the tracer suite runs as root in CI)"
    exit 1
  fi
  for t in "$sbin/ddheap-live.bt" "$sbin/ddheap-alloc.bt" "$sbin/ddheap-events.bt"; do
    rc=0
    bpftrace -d "$t" "$work/consumer-pc" >"$work/dry.txt" 2>&1 || rc=$?
    [ $rc = 0 ] || tail -5 "$work/dry.txt"
    result $rc "bpftrace -d ${t#"$work/root"} against the installed consumer (parsed, compiled, probes found)"
  done
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
  exit
fi

# The installed ddheap-fold on a saved table, as ddheap-live.bt prints it:
# the same stack from two threads, frames leaf first, ddheap's own frames
# on top. Its header comment promises one line per stack, root first,
# offsets and ddheap frames dropped, the threads' values summed.
for value in 100 200; do
  printf '@live_bytes[\n%s\n]: %s\n' '    ddheap_fire_alloc+3
    dd_allocation_created+20
    site_a+12
    main+40
    __libc_start_call_main+122' "$value"
done >"$work/saved.txt"
printf '@live_bytes[\n    site_b+8\n    main+52\n]: 7\n' >>"$work/saved.txt"
rc=0
folded=$("$bin/ddheap-fold" <"$work/saved.txt") || rc=$?
[ $rc = 0 ] && [ "$folded" = "$(printf '%s\n' '__libc_start_call_main;main;site_a 300' 'main;site_b 7')" ] || rc=1
[ $rc = 0 ] || printf 'got:\n%s\n' "$folded"
result $rc "installed ddheap-fold folds a saved table"

# 2. As a subproject (a copy of the tracked sources, no build dirs).
mkdir -p "$work/proj/subprojects/ddheap"
cp -r "$src/tests/consumer/"{meson.build,consumer.c} "$work/proj/"
(cd "$src" && git ls-files -z 2>/dev/null || find . -path ./build\* -prune -o -type f -print0) |
  (cd "$src" && xargs -0 cp --parents -t "$work/proj/subprojects/ddheap")
rc=0
(CC="${cc[*]}" meson setup "$work/proj/build" "$work/proj" -Db_sanitize="$sanitize" -Db_lundef="$lundef" \
   -Dddheap:tests=false -Dddheap:bench=false -Dddheap:examples=false >/dev/null &&
 meson compile -C "$work/proj/build" >/dev/null && "$work/proj/build/consumer") || rc=$?
result $rc "meson subproject with dependency('ddheap') fallback"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
