# Native (x86-64) builds, each running the tests whose result can differ
# in it, so that no test runs twice where the second run could not fail
# where the first passed (suites: tests/meson.build; times and the reasons
# in docs/reliability.md, "How long the suite takes"):
#
#   header debug    suites 'frames' (what the build type changes) and
#                   'once'; its unit and stress suites run in stage 20,
#                   same build type and scheme, under ASan, UBSan and TSan
#   header release  everything but suite 'once': the tracer, preload and
#                   prof suites run here, in the build users ship
#   shadow release  everything the marking scheme changes: all but suites
#                   'once', 'ratelimit' (rates do not depend on the scheme),
#                   'packaging', 'preload' and 'cpython' (the preload
#                   library always marks with the shadow scheme: it is the
#                   same in the header builds)
#   shadow debug    suite 'frames', what the build type changes (probe
#                   registers, the frames a tracer walks); the rest of
#                   this scheme's debug build runs in stages 20 and 30,
#                   under ASan, UBSan, TSan and valgrind
#   nolive-otel     the non-default build options, against the tests that
#                   state their behaviour (suite 'options')
#
# Suite 'once' (the installed bpftrace scripts, the harness against
# bpftrace, the project's scripts) does not depend on the build at all;
# suite 'ratelimit' measures rates in wall-clock time, in the build users
# ship; suite 'estimates' checks what the shipped scripts report, which the
# scheme changes and the build type does not; suite 'packaging' (the
# installed consumers) runs here in the release build and in every build of
# stage 20. Suite 'cpython' (CPython's regression tests under
# ddheap-run and ddheap-prof, ~3 min) runs in the release build only, the
# build users ship. The tracer, prof and cpython suites need root.
set -euo pipefail
setup() { # dir, options...
  local dir=$1; shift
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
  # ninja reports compiler errors on stdout: keep only its failure output
  meson compile -C "$dir" >"$dir.compile.log" 2>&1 || { cat "$dir.compile.log"; return 1; }
}
run() { # dir, meson test selection...
  local dir=$1; shift
  meson test -C "$dir" --print-errorlogs --num-processes 2 "$@"
}
# -Dprof=enabled: ddheap-prof and its suite must be built here, never left
# out quietly because a dependency went missing. The benchmarks are
# compiled once, in the release build (no test runs them; bench/run does).
# ddheap-prof's suite runs in the release build only (the tool as installed):
# not built here, like the shadow builds below.
setup build-ci/native-debug -Dbuildtype=debug -Dprof=disabled -Dbench=false -Dexamples=false
run build-ci/native-debug --suite frames --suite once
setup build-ci/native-release -Dbuildtype=release -Dprof=enabled
run build-ci/native-release --no-suite once
# ddheap-prof does not depend on how the library marks blocks: its suite
# ran above, and it is not built here.
shadow=(-Dmarking=shadow -Dprof=disabled -Dbench=false -Dexamples=false)
setup build-ci/native-shadow-release -Dbuildtype=release "${shadow[@]}"
run build-ci/native-shadow-release --no-suite once --no-suite ratelimit --no-suite preload \
  --no-suite packaging --no-suite cpython
setup build-ci/native-shadow-debug -Dbuildtype=debug "${shadow[@]}"
run build-ci/native-shadow-debug --suite frames
dir=build-ci/native-nolive-otel
setup "$dir" -Dlive_heap=false -Dproviders=otel_memory -Dbench=false -Dexamples=false
run "$dir" --suite options
