#!/bin/sh
# exe_wrapper of the 'valgrind' test setup (tests/meson.build): runs a test
# under valgrind memcheck when it is a compiled program, and as is when it
# is a driver script (python, meson), whose interpreter is not ours to
# check. Any memcheck error or definite/indirect leak fails the test.
#
# Extra valgrind flags come from DDHEAP_VALGRIND_FLAGS (space separated).
# DDHEAP_VALGRIND_NO_SUPPRESSIONS=1 leaves out valgrind.supp (the header
# scheme's peek): a shadow-marking build must pass without it.
first=$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ')
if [ "$first" = '177ELF' ]; then
  supp="--suppressions=$(dirname "$0")/valgrind.supp"
  [ "${DDHEAP_VALGRIND_NO_SUPPRESSIONS:-0}" = 1 ] && supp=
  # shellcheck disable=SC2086
  exec valgrind --tool=memcheck --error-exitcode=99 --exit-on-first-error=no \
    --leak-check=full --show-leak-kinds=definite,indirect \
    --errors-for-leak-kinds=definite,indirect \
    $supp $DDHEAP_VALGRIND_FLAGS "$@"
fi
exec "$@"
