#!/usr/bin/env bash
# A rank of a sharded `memc run` that dies (kill -9) ends the job: the other rank exits non-zero
# within 30 s with one line naming the dead rank, and never hangs. A data file that differs
# across ranks is refused before the first step.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"
command -v mpirun >/dev/null || { echo "SKIP: no mpirun (scripts/setup.sh installs OpenMPI)"; exit 77; }
$MEMC compile models/vit_tiny.onnx --batch 8 --devices 2 --shard zero2 -o "$TMP/p.plan" >/dev/null 2>"$TMP/err" || fail "compile: $(cat "$TMP/err")"

# The dead rank: found by its launcher-given rank in its environment.
bash tests/comm/mpirun.sh 2 $MEMC run "$TMP/p.plan" --data data/digits_train.npz --epochs 50 --quiet >"$TMP/out" 2>"$TMP/job_err" &
job=$!
victim=""
for _ in $(seq 300); do
  for pid in $(pgrep -f "memc run $TMP/p.plan"); do
    if tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then victim=$pid; fi
  done
  [ -n "$victim" ] && break
  sleep 0.1
done
if [ -z "$victim" ]; then
  kill -9 $job 2>/dev/null; fail "rank 1 never started: $(head -3 "$TMP/job_err")"
else
  sleep 2  # training under way
  kill -9 "$victim"
  start=$(date +%s)
  for _ in $(seq 600); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
  if kill -0 $job 2>/dev/null; then
    kill -9 $job; pkill -9 -f "memc run $TMP/p.plan"; fail "the job still runs 60 s after rank 1 died (a hang)"
  else
    wait $job; rc=$?
    took=$(( $(date +%s) - start ))
    [ $rc -ne 0 ] && [ $took -le 30 ] && pass "rank 1 killed: the job exited $rc after ${took} s" || fail "rank 1 killed: exit $rc after ${took} s"
    grep -q "^memc: rank 0 of 2: .*rank 1 (pid $victim) is gone" "$TMP/job_err" && pass "rank 0 names the dead rank: $(grep '^memc: rank 0' "$TMP/job_err")" \
      || fail "no line naming rank 1: $(head -5 "$TMP/job_err")"
  fi
fi

# Ranks that read different data files (both valid): refused before the first step.
cat > "$TMP/pick.sh" <<EOF
#!/usr/bin/env bash
if [ "\$OMPI_COMM_WORLD_RANK" = 1 ]; then exec $MEMC run "$TMP/p.plan" --data data/digits_test.npz --steps 1 --quiet; fi
exec $MEMC run "$TMP/p.plan" --data data/digits_train.npz --steps 1 --quiet
EOF
timeout 120 bash tests/comm/mpirun.sh 2 bash "$TMP/pick.sh" >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -ne 0 ] && grep -q "^memc: .*differ" "$TMP/err" && pass "different data files across ranks: exit $rc, $(grep -m1 '^memc: ' "$TMP/err")" \
  || fail "different data files: exit $rc, $(head -4 "$TMP/err")"

# A bad argument only rank 0 sees (its --json exists; the other ranks write no report) ends the
# job with exit 2: before, rank 0 returned and waited in MPI_Finalize while rank 1 waited in its
# first collective, and the job hung.
echo '{}' > "$TMP/taken.json"
start=$(date +%s)
timeout 60 bash tests/comm/mpirun.sh 2 $MEMC run "$TMP/p.plan" --data data/digits_train.npz --steps 3 --quiet --json "$TMP/taken.json" >"$TMP/out" 2>"$TMP/err"; rc=$?
took=$(( $(date +%s) - start ))
[ $rc -eq 2 ] && [ $took -le 30 ] && grep -q "^memc: --json .*exists" "$TMP/err" && [ "$(cat "$TMP/taken.json")" = "{}" ] \
  && pass "rank 0's --json exists: exit 2 after ${took} s, the file kept, $(grep -m1 '^memc: ' "$TMP/err")" \
  || fail "rank 0's --json exists: exit $rc after ${took} s, $(head -4 "$TMP/err")"
# What the user reads first is memc's line, not Open MPI's page about MPI_ABORT (help-mpi-api.txt):
# the aborting rank quiets it (backends/comm/mpi_communicator.cc).
head -1 "$TMP/err" | grep -q "^memc: " && ! grep -q "MPI_ABORT was invoked" "$TMP/err" \
  && pass "a failing rank's stderr: memc's lines only ($(wc -l <"$TMP/err") lines, no MPI_ABORT page)" \
  || fail "a failing rank's stderr is not memc's line first: $(head -c 400 "$TMP/err")"
finish
