#!/usr/bin/env bash
# The per-rank step timeline of `memc run --profile --json` (runtime/op_profile.h): on 2 and 3
# MPI ranks, zero2 and zero3, every rank reports its last training step's collectives in the
# order they started, the same ops on every rank, as many as the profile counted per step
# (the *_start calls and the blocking calls: two independent recordings), each inside the step,
# with waits no longer than the time in flight, and some of zero3's prefetched gathers spanning
# compute (hidden > 0); MPI gives no device time (transfer_ms null: NCCL's come from CUDA
# events). Also: the text report prints one timeline line per rank, the report names its
# communicator, and a run on one device reports a timeline without collectives.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"
command -v mpirun >/dev/null || { echo "SKIP: no mpirun (scripts/setup.sh installs OpenMPI)"; exit 77; }

CHECK='
import json, sys
j = json.load(open(sys.argv[1]))
ranks, stage = int(sys.argv[2]), sys.argv[3]
prof = j["op_profile"]
tl = prof["timeline"]
assert len(tl) == ranks, ("ranks", len(tl))
steps = prof["steps"]
per_step = 0
for op in prof["ops"]:
    if op["category"] != "collective" or op["op"].endswith("_done"):
        continue
    assert op["calls"] % steps == 0, op
    per_step += op["calls"] // steps
ops0 = [c["op"] for c in tl[0]["collectives"]]
assert len(ops0) == per_step, ("collectives", len(ops0), "profile per step", per_step)
hidden = 0.0
eps = 1e-3
for r in tl:
    assert [c["op"] for c in r["collectives"]] == ops0, ("rank", r["rank"], "ops differ")
    assert 0 < r["kernel_ms"] <= r["step_ms"] + eps, r
    last = -1.0
    for c in r["collectives"]:
        assert c["start_ms"] >= last - eps, ("order", c)
        last = c["start_ms"]
        assert 0 <= c["start_ms"] <= c["end_ms"] <= r["step_ms"] + eps, ("inside the step", c, r["step_ms"])
        assert 0 <= c["wait_ms"] <= c["end_ms"] - c["start_ms"] + eps, ("wait", c)
        assert c["hidden_ms"] >= -eps, ("hidden", c)
        assert c["transfer_ms"] is None, ("MPI does not time its collectives", c)  # NCCL: CUDA events
        hidden = max(hidden, c["hidden_ms"])
need = {"zero2": {"reduce_scatter", "all_gather"}, "zero3": {"reduce_scatter", "all_gather"}}[stage]
assert need <= set(ops0), ("ops", set(ops0))
assert j["communicator"] == "mpi", j.get("communicator")
if stage == "zero3":
    assert hidden > 0, "no prefetched gather spans compute"
print("%d collectives per rank, ops %s, largest hidden %.3f ms" % (len(ops0), sorted(set(ops0)), hidden))
'

for case in "2 zero3" "3 zero2" "3 zero3"; do
  set -- $case
  np=$1 stage=$2 d="$TMP/$np$stage"
  mkdir -p "$d"
  "$MEMC" compile models/vit_tiny.onnx --batch 12 --optimizer adamw --devices "$np" --shard "$stage" -o "$d/p.plan" > /dev/null \
    || { fail "compile $np $stage"; continue; }
  bash tests/comm/mpirun.sh "$np" "$MEMC" run "$d/p.plan" --data data/digits_train.npz --steps 6 --threads 1 --profile \
    --json "$d/r.json" > "$d/out" 2>&1 || { fail "run $np $stage: $(tail -3 "$d/out")"; continue; }
  lines=$(grep -c "^  rank [0-9]*, last step" "$d/out")
  [ "$lines" -eq "$np" ] && pass "$np ranks $stage: $lines timeline lines" || fail "$np ranks $stage: $lines timeline lines, want $np"
  got=$(python3 -c "$CHECK" "$d/r.json" "$np" "$stage" 2>&1) && pass "$np ranks $stage: $got" || fail "$np ranks $stage: $got"
done

# One device: the timeline has the step and no collectives.
"$MEMC" compile models/vit_tiny.onnx --batch 8 -o "$TMP/one.plan" > /dev/null
"$MEMC" run "$TMP/one.plan" --data data/digits_train.npz --steps 3 --profile --json "$TMP/one.json" > /dev/null 2>&1 || fail "one device run"
got=$(python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))["op_profile"]["timeline"]
assert len(t) == 1 and t[0]["collectives"] == [] and t[0]["step_ms"] > 0, t
print("step %.2f ms, no collectives" % t[0]["step_ms"])' "$TMP/one.json" 2>&1) && pass "one device: $got" || fail "one device: $got"
finish
