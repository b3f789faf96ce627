#!/usr/bin/env bash
# scripts/install-deps decides what to install with installed()/missing().
# A bare package name must mean the native architecture's copy (or the
# architecture-independent one), never a foreign copy: on a machine that
# had only systemtap-sdt-dev:arm64, `dpkg-query -W systemtap-sdt-dev`
# answered "installed" and the native sys/sdt.h was never installed.
#
# Part 1 runs the functions against a fake dpkg/dpkg-query holding a chosen
# state (the fake answers a bare name with every installed copy, as the
# real dpkg-query does). Part 2 asks the real dpkg: every package the
# script lists must be reported installed once it has run (CI runs it
# first), which also checks the real dpkg-query's answers to NAME:ARCH and
# NAME:all. Usage: test_install_deps.sh PATH/TO/install-deps
set -uo pipefail
script=$1
fails=0
check() { # description, expected, actual
  if [ "$2" = "$3" ]; then echo "ok     $1"; else echo "FAILED $1: expected '$2', got '$3'"; fails=$((fails+1)); fi
}

fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
cat >"$fake/dpkg" <<'FAKE'
#!/bin/sh
[ "$1" = --print-architecture ] && { cat "$FAKE_DPKG_DIR/arch"; exit 0; }
exit 2
FAKE
# dpkg-query -W -f=FORMAT SPEC: one status line per installed copy that
# SPEC names (all architectures for a bare name); FORMAT must ask for
# ${Status} and nothing else the fake would have to invent.
cat >"$fake/dpkg-query" <<'FAKE'
#!/bin/sh
spec=$(eval echo \${$#})
case $spec in *:*) name=${spec%%:*} arch=${spec#*:} ;; *) name=$spec arch='*' ;; esac
found=1
while read -r n a status; do
  [ "$n" = "$name" ] || continue
  case $a in $arch) printf '%s\n' "$status" | tr _ ' '; found=0 ;; esac
done <"$FAKE_DPKG_DIR/state"
[ $found = 0 ] || echo "dpkg-query: no packages found matching $spec" >&2
exit $found
FAKE
chmod +x "$fake/dpkg" "$fake/dpkg-query"
cat >"$fake/state" <<'STATE'
systemtap-sdt-dev arm64 install_ok_installed
meson all install_ok_installed
libcmocka-dev amd64 install_ok_installed
libcmocka-dev arm64 install_ok_installed
gcc amd64 install_ok_installed
valgrind amd64 deinstall_ok_config-files
STATE

ask() { # native arch, packages...: what missing() prints, on one line
  local arch=$1
  shift
  echo "$arch" >"$fake/arch"
  FAKE_DPKG_DIR=$fake PATH="$fake:$PATH" bash -c 'source "$1"; shift; missing "$@"' _ "$script" "$@" | xargs
}
check "only the arm64 copy: the native one is missing" "systemtap-sdt-dev" "$(ask amd64 systemtap-sdt-dev)"
check "the arm64 copy asked by name is there" "" "$(ask amd64 systemtap-sdt-dev:arm64)"
check "an Architecture: all package counts as native" "" "$(ask amd64 meson)"
check "both copies: native and foreign there" "" "$(ask amd64 libcmocka-dev libcmocka-dev:arm64 gcc)"
check "config files only is not installed" "valgrind" "$(ask amd64 valgrind)"
check "a foreign copy never installed" "gcc:arm64" "$(ask amd64 gcc:arm64)"
check "on an arm64 machine the amd64 gcc is not native" "gcc" "$(ask arm64 gcc)"
check "unknown package" "no-such-package" "$(ask amd64 no-such-package)"

# Part 2: the real dpkg, after install-deps has run.
if command -v dpkg-query >/dev/null; then
  left=$(bash -c 'source "$1"; missing "${native[@]}" "${arm64[@]}"' _ "$script" | xargs)
  check "every package install-deps lists is installed (real dpkg; run scripts/install-deps if not)" "" "$left"
else
  echo "FAILED no dpkg-query: ddheap builds on Debian 12"
  fails=$((fails+1))
fi
[ $fails = 0 ]
