# aarch64 under qemu-user: the whole suite except 'tracer' (bpftrace cannot
# trace a program that qemu-aarch64 runs: the uprobes would land in qemu's
# own code) in the three marking schemes, pointer tag (the default on
# aarch64), header and shadow, so a change to any scheme or to the shared core is tested
# on the architecture it was written for. The TBI build also runs in the
# release build type: the probe notes and the inlined fast path must hold
# at -O2 as well as at -O0. Like the native stage, one more build turns the
# options off (no live heap, one provider) and runs suite 'options'.
# Benchmarks are not built (timings under emulation mean nothing), nor
# the examples (no test runs them; the native stage compiles them). Every
# variant runs even if one fails, so one CI run shows all of them; the
# stage fails if any did. See docs/arm64.md.
#
# Needs what scripts/install-deps installs (the cross compiler, qemu-user,
# libcmocka-dev:arm64, systemtap-sdt-dev:arm64). DDHEAP_BUILD_ROOT moves
# the build directories (default build-ci/).
set -euo pipefail
cd "$(dirname "$0")/../.."

root=${DDHEAP_BUILD_ROOT:-build-ci}
cross=cross/aarch64-linux.meson
mkdir -p "$root"
summary=()
failed=0

now_ms() { echo $(($(date +%s%N) / 1000000)); }
seconds() { printf '%d.%d s' $(($1 / 1000)) $(($1 % 1000 / 100)); }

# name | meson options | meson test selection
# (suite 'once' does not depend on the build: it runs in the native stage)
variants=(
  "tbi-debug|-Dbuildtype=debug -Dmarking=tbi|--no-suite tracer --no-suite once"
  "tbi-release|-Dbuildtype=release -Dmarking=tbi|--no-suite tracer --no-suite once"
  "header-debug|-Dbuildtype=debug -Dmarking=header|--no-suite tracer --no-suite once"
  "shadow-debug|-Dbuildtype=debug -Dmarking=shadow|--no-suite tracer --no-suite once"
  "tbi-options|-Dbuildtype=debug -Dmarking=tbi -Dlive_heap=false -Dproviders=otel_memory|--suite options"
)

for spec in "${variants[@]}"; do
  IFS='|' read -r variant options selection <<<"$spec"
  dir=$root/aarch64-$variant
  # shellcheck disable=SC2206 # the option strings are split on purpose
  args=(--cross-file "$cross" $options -Dbench=false -Dexamples=false)
  start=$(now_ms)
  result=passed
  # --wipe keeps a reused directory from carrying stale options.
  wipe=()
  [ -d "$dir/meson-private" ] && wipe=(--wipe)
  setup_log=$root/aarch64-$variant.setup.log
  setup_ok=1
  meson setup "${wipe[@]}" "$dir" "${args[@]}" >"$setup_log" 2>&1 || setup_ok=0
  [ $setup_ok = 1 ] || tail -n 30 "$setup_log"
  if [ $setup_ok = 1 ] && meson compile -C "$dir"; then
    built=$(now_ms)
    # Emulation is slower than native: the multiplier keeps per-test
    # timeouts about the work, not about the emulator.
    # shellcheck disable=SC2086
    meson test -C "$dir" $selection --print-errorlogs --num-processes 2 \
      --timeout-multiplier 4 || result=FAILED
  else
    built=$(now_ms)
    result="FAILED to build"
  fi
  end=$(now_ms)
  [ "$result" = passed ] || failed=1
  summary+=("$(printf 'aarch64 %-13s %-15s build %s, tests %s' "$variant" "$result" \
    "$(seconds $((built - start)))" "$(seconds $((end - built)))")")
  echo "=== ${summary[-1]}"
done
printf '=== %s\n' "${summary[@]}"
exit $failed
