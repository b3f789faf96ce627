# The unit suite under valgrind memcheck (`meson test --setup valgrind`,
# defined at the end of tests/meson.build): zero errors and zero definite
# or indirect leaks in every compiled test, for the default (header) build
# and for a shadow-marking build without the suppression file. A debug build, because the one
# suppression (tests/robust/valgrind.supp) names an inline function and
# needs debug info to see it. First, a canary proves the setup fails on a
# real invalid read; docs/reliability.md explains the suppression.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${DDHEAP_BUILD_ROOT:-build-ci}
dir=$root/valgrind

canary_dir=$(mktemp -d)
trap 'rm -rf "$canary_dir"' EXIT
cat >"$canary_dir/canary.c" <<'C'
#include <stdlib.h>
#include <string.h>
int main(void)
{
    char *p = malloc(32), before[8];
    memcpy(before, p - 8, sizeof before); /* the kind of read the suppression must not hide */
    free(p);
    return before[0] == 42;
}
C
cc -g -O0 -o "$canary_dir/canary" "$canary_dir/canary.c"
if tests/robust/valgrind_wrapper.sh "$canary_dir/canary" >"$canary_dir/log" 2>&1; then
  cat "$canary_dir/log"
  echo "30-valgrind: the canary's invalid read was not reported: the setup cannot fail" >&2
  exit 1
fi
grep -q "Invalid read" "$canary_dir/log"

# ddheap-prof's suite runs in the native stage, not here: not built.
# Nor are the benchmarks and examples, which no test here runs.
opts=(-Dbuildtype=debug -Dbench=false -Dexamples=false -Dprof=disabled)
meson setup --wipe "$dir" "${opts[@]}" >/dev/null 2>&1 || meson setup "$dir" "${opts[@]}"
meson compile -C "$dir"
# Suite 'packaging' (tests/consumer) builds and runs programs of its own,
# outside memcheck: it runs in the native and sanitizer stages.
meson test -C "$dir" --setup valgrind --suite unit --no-suite packaging --print-errorlogs \
  --num-processes 2

# The shadow scheme reads nothing outside the blocks it is given: its build
# runs the same suite with no suppression file at all.
dir=$root/valgrind-shadow
opts+=(-Dmarking=shadow)
meson setup --wipe "$dir" "${opts[@]}" >/dev/null 2>&1 || meson setup "$dir" "${opts[@]}"
meson compile -C "$dir"
DDHEAP_VALGRIND_NO_SUPPRESSIONS=1 \
  meson test -C "$dir" --setup valgrind --suite unit --no-suite packaging --print-errorlogs \
  --num-processes 2
