#!/usr/bin/env bash
# Fault checks for the MPI communicator, 4 ranks (tests/comm/mpirun.sh):
#   dead:  kill -9 rank 1 mid-training; the survivors must exit non-zero within 30 s, each
#          with one line naming rank 1 and its pid.
#   stuck: rank 1 never joins the all-reduce; with MEMC_COMM_TIMEOUT_S=3 the others must fail
#          within 20 s with one line naming the collective and the timeout.
# Usage: tests/comm/fault.sh dead|stuck path/to/comm_fault_rank
set -uo pipefail
mode=$1 binary=$2
here=$(dirname "$0")
command -v mpirun > /dev/null || { echo "SKIP: no mpirun (apt-get install openmpi-bin)"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL ($mode): $*"; echo "--- stderr of the job:"; cat "$dir/err"; exit 1; }

# The dead case exercises mpirun's own detection, so its timeout stays long.
if [ "$mode" = stuck ]; then export MEMC_COMM_TIMEOUT_S=3; else export MEMC_COMM_TIMEOUT_S=600; fi
bash "$here/mpirun.sh" 4 "$binary" "$mode" "$dir" > "$dir/out" 2> "$dir/err" &
job=$!
for _ in $(seq 300); do  # every rank up (at most 30 s)
  [ "$(ls "$dir"/*.pid 2>/dev/null | wc -l)" -eq 4 ] && break
  sleep 0.1
done
[ "$(ls "$dir"/*.pid 2>/dev/null | wc -l)" -eq 4 ] || { kill -9 $job; fail "the 4 ranks did not start"; }
victim=$(cat "$dir/1.pid")
sleep 0.5
if [ "$mode" = dead ]; then
  kill -9 "$victim"
fi
start=$(date +%s.%N)
# Bound the wait: a hang is a failure, never a stuck test.
for _ in $(seq 600); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
if kill -0 $job 2>/dev/null; then kill -9 $job; fail "the job still runs 60 s later (a hang)"; fi
wait $job; rc=$?
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
below() { awk -v x="$1" -v y="$2" 'BEGIN { exit !(x < y) }'; }
[ $rc -ne 0 ] || fail "mpirun exited 0"
if [ "$mode" = dead ]; then
  below "$elapsed" 30 || fail "survivors took ${elapsed} s to exit"
  lines=$(grep -c "^memc: rank [023] of 4: stopped by the launcher.*: rank 1 (pid $victim) is gone$" "$dir/err")
  [ "$lines" -eq 3 ] || fail "expected one line per survivor naming rank 1 (pid $victim), found $lines"
  grep -q "rank 1 .*exited on signal 9" "$dir/err" || fail "mpirun did not name rank 1"
else
  below "$elapsed" 20 || fail "the others took ${elapsed} s to fail"
  grep -Eq "^memc: rank [023] of 4: all_reduce did not complete within 3 s$" "$dir/err" \
    || fail "no line naming the all_reduce and the 3 s timeout"
fi
echo "ok ($mode): mpirun exit $rc, ${elapsed} s after the fault; the job said:"
grep "^memc:" "$dir/err"
