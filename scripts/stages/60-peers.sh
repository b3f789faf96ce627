# bench/peers --quick: ddheap side by side with heaptrack, jemalloc's and
# gperftools' heap profilers and bcc's memleak, one round on small inputs
# (about 2 minutes), so that the comparison in docs/performance.md can
# always be run again. No thresholds: the stage fails only if a run fails
# (a program crashes, a profiler exits non-zero or writes no profile, a
# profile cannot be read back). Needs root (BPF) and installs the peers
# from Debian itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${DDHEAP_BUILD_ROOT:-build-ci}
bench/peers --quick --build "$root/peers"
