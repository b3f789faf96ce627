# Native (x86-64) build in the default (debug) and release build types,
# for the default marking scheme and for shadow marking: the whole meson
# test suite, tracer tests included (they need root). Then
# the non-default build options, against the tests that state their
# behaviour (suite 'options').
set -euo pipefail
setup() { # dir, options...
  local dir=$1; shift
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
  # ninja reports compiler errors on stdout: keep only its failure output
  meson compile -C "$dir" >"$dir.compile.log" 2>&1 || { cat "$dir.compile.log"; return 1; }
}
for buildtype in debug release; do
  dir=build-ci/native-$buildtype
  # -Dprof=enabled: ddheap-prof and its suite must be built here, never
  # left out quietly because a dependency went missing.
  setup "$dir" -Dbuildtype=$buildtype -Dprof=enabled
  meson test -C "$dir" --print-errorlogs --num-processes 2
done
# Shadow marking (-Dmarking=shadow), the whole suite again, tracer and the
# in-process interposition included. ddheap-prof does not depend on how the
# library marks blocks: its suite ran above.
for buildtype in debug release; do
  dir=build-ci/native-shadow-$buildtype
  setup "$dir" -Dbuildtype=$buildtype -Dmarking=shadow -Dprof=disabled
  meson test -C "$dir" --print-errorlogs --num-processes 2
done
dir=build-ci/native-nolive-otel
setup "$dir" -Dlive_heap=false -Dproviders=otel_memory -Dbench=false -Dexamples=false
meson test -C "$dir" --print-errorlogs --suite options
