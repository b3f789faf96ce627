# Native (x86-64) build in the default (debug) and release build types:
# the whole meson test suite, tracer tests included (they need root). Then
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
# Shadow marking: the in-process libc interposition (dd_heap_interpose_libc,
# tests/interpose) works only there; the unit suite covers it, the preload
# library is shadow in every build and is traced by the builds above.
dir=build-ci/native-shadow
setup "$dir" -Dmarking=shadow
meson test -C "$dir" --print-errorlogs --num-processes 2 --suite unit
dir=build-ci/native-nolive-otel
setup "$dir" -Dlive_heap=false -Dproviders=otel_memory -Dbench=false -Dexamples=false
meson test -C "$dir" --print-errorlogs --suite options
