# The unit and stress suites under AddressSanitizer + UndefinedBehaviorSanitizer
# (gcc) and under ThreadSanitizer (clang), each in its own build directory,
# for the default marking scheme and for shadow marking.
# Any sanitizer report fails the test that produced it: ASan and TSan exit
# non-zero on a report, and UBSan is told to halt on its first one.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${DDHEAP_BUILD_ROOT:-build-ci}

export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

run() { # name, CC, suite selection, meson options...
  local name=$1 compiler=$2 selection=$3
  shift 3
  local dir=$root/$name
  # ddheap-prof is not in the suites run here (suite 'prof' runs in the
  # native stage): it is not built, which saves two builds of it; nor are
  # the benchmarks and examples, which no test runs.
  set -- "$@" -Dprof=disabled -Dbench=false -Dexamples=false
  CC=$compiler meson setup --wipe "$dir" "$@" >/dev/null 2>&1 || CC=$compiler meson setup "$dir" "$@"
  meson compile -C "$dir"
  # shellcheck disable=SC2086 # the selection is split on purpose
  meson test -C "$dir" --print-errorlogs --num-processes 2 --timeout-multiplier 3 --suite unit \
    --suite stress $selection
}

# 'consumers' (suite 'packaging') builds its outside programs with this
# build's compiler and -fsanitize flags (tests/consumer/check_consumers.sh):
# it runs in the default build of each sanitizer, not again over shadow
# marking, which changes nothing in how a consumer is built.

run asan-ubsan gcc '' -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false
run tsan clang '' -Dbuildtype=debug -Db_sanitize=thread -Db_lundef=false
# The shadow scheme has no no_sanitize exemption to lean on: any read
# outside a block would be reported (the slab test poisons free objects).
run asan-ubsan-shadow gcc '--no-suite packaging' -Dbuildtype=debug -Dmarking=shadow \
  -Db_sanitize=address,undefined -Db_lundef=false
run tsan-shadow clang '--no-suite packaging' -Dbuildtype=debug -Dmarking=shadow \
  -Db_sanitize=thread -Db_lundef=false
