# Native (x86-64) build in the default (debug) and release build types:
# the whole meson test suite, tracer tests included (they need root).
set -euo pipefail
for buildtype in debug release; do
  dir=build-ci/native-$buildtype
  meson setup --wipe "$dir" -Dbuildtype=$buildtype >/dev/null 2>&1 || meson setup "$dir" -Dbuildtype=$buildtype
  meson compile -C "$dir"
  meson test -C "$dir" --print-errorlogs --num-processes 2
done
