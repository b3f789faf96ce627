#!/bin/sh
# exe_wrapper of the 'valgrind' test setup (tests/meson.build): runs a test
# under valgrind memcheck when it is a compiled program, and as is when it
# is a driver script (python, bash), whose interpreter is not ours to
# check. Any memcheck error or definite/indirect leak fails the test.
#
# meson hands a script test over as its interpreter (/usr/bin/python3
# script.py ...), an ELF file too: programs installed on the system are
# therefore run as they are (under memcheck, python3 alone takes 5 s to
# start, and nothing of ours is checked, valgrind not following children).
#
# Extra valgrind flags come from DDHEAP_VALGRIND_FLAGS (space separated).
# DDHEAP_VALGRIND_NO_SUPPRESSIONS=1 leaves out valgrind.supp (the header
# scheme's peek): a shadow-marking build must pass without it.
case "$(readlink -f "$1")" in
  /usr/* | /bin/* | /sbin/*) exec "$@" ;;
esac
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
