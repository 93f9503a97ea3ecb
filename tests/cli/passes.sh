# Memory-pass flags of memc compile: --micro-batches.
source "$(dirname "$0")/common.bash" "$@"

$MEMC compile models/vit_tiny.onnx --batch 16 -o "$TMP/one.plan" --json >"$TMP/one.json" 2>"$TMP/err" || fail "compile: $(cat "$TMP/err")"
$MEMC compile models/vit_tiny.onnx --batch 16 --micro-batches 3 -o "$TMP/mb.plan" --json >"$TMP/mb.json" 2>"$TMP/err" || fail "compile k=3: $(cat "$TMP/err")"
python3 -c '
import json, sys
one, mb = (json.load(open(p)) for p in sys.argv[1:3])
assert mb["decisions"]["micro_batches"] == 3, mb["decisions"]
assert mb["predicted_peak_bytes"] < one["predicted_peak_bytes"], (mb["predicted_peak_bytes"], one["predicted_peak_bytes"])
' "$TMP/one.json" "$TMP/mb.json" && pass "--micro-batches 3: stored in decisions, lower planned peak" || fail "micro-batch json"
$MEMC run "$TMP/mb.plan" --data data/digits_train.npz --steps 2 --quiet --json "$TMP/mb_run.json" >/dev/null 2>"$TMP/err" || fail "run k=3: $(cat "$TMP/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["measured_peak_bytes"] == d["predicted_peak_bytes"], d
' "$TMP/mb_run.json" && pass "micro-batched run: measured peak = planned peak" || fail "micro-batch run json"
expect_error 2 "must be between 1 and the batch size 4" -- $MEMC compile models/vit_tiny.onnx --batch 4 --micro-batches 8 -o "$TMP/x.plan"
expect_error 2 "micro-batches" -- $MEMC compile models/vit_tiny.onnx --batch 4 --micro-batches 0 -o "$TMP/x.plan"
expect_error 2 "re-export with a dynamic batch" -- $MEMC compile models/bigbird_sparse.onnx --batch 4 --seq 64 --micro-batches 2 -o "$TMP/x.plan"
[ ! -e "$TMP/x.plan" ] && pass "no plan written on refused flags" || fail "plan written"
finish
