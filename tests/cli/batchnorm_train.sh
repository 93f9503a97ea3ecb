#!/usr/bin/env bash
# A BatchNorm exported in train() (models/bn_net_train_t215.onnx) through the command line:
# inspect lists its running statistics as buffers; training normalizes with batch statistics and updates the running statistics (buffers, not
# constants: no warning says otherwise); the checkpoint carries them, `memc export` writes them
# into the model (a plan compiled from the exported file evaluates to the same accuracy), and
# micro-batches are refused in one line.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"

$MEMC inspect models/bn_net_train_t215.onnx --json >"$TMP/inspect.json" 2>"$TMP/err" || fail "inspect: $(cat "$TMP/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert [o["name"] for o in d["outputs"]] == ["logits"], d["outputs"]
assert len(d["buffers"]) == 6 and "bn1.running_mean" in d["buffers"], d["buffers"]
assert not set(d["buffers"]) & set(d["trainable_params"]), d["trainable_params"]
' "$TMP/inspect.json" && pass "inspect: 6 buffers, not trained, not outputs" || fail "inspect json: $(head -c 400 "$TMP/inspect.json")"

PLAN="$TMP/bn.plan"
if $MEMC compile models/bn_net_train_t215.onnx --batch 4 --optimizer sgd --lr 0.05 --epochs 1 -o "$PLAN" >"$TMP/out" 2>"$TMP/err"; then
  pass "compile"
else fail "compile: $(cat "$TMP/err")"; fi
grep -q "running_" "$TMP/err" && fail "a running statistic was warned about: $(grep running_ "$TMP/err")"

if $MEMC run "$PLAN" --data data/digits_train.npz --eval data/digits_test.npz --steps 40 --quiet --checkpoint "$TMP/ck" \
     --json "$TMP/report.json" >"$TMP/out" 2>"$TMP/err"; then
  pass "run: $(tr '\n' ' ' <"$TMP/out")"
else fail "run: $(cat "$TMP/err")"; fi
python3 -c '
import json, struct, sys
d = json.load(open(sys.argv[1]))
assert d["measured_peak_bytes"] == d["predicted_peak_bytes"], d
assert d["accuracy"] > 0.3, d["accuracy"]
with open(sys.argv[2], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
for bn, c in (("bn1", 8), ("bn2", 8), ("bn3", 16)):
    for stat in ("running_mean", "running_var"):
        assert header[f"{bn}.{stat}"]["shape"] == [c], header.get(f"{bn}.{stat}")
' "$TMP/report.json" "$TMP/ck/checkpoint.safetensors" && pass "planned = measured; the checkpoint holds the running statistics" ||
  fail "report or checkpoint: $(head -c 400 "$TMP/report.json")"

# The exported model holds the trained running statistics: evaluated as a plan of its own, its
# accuracy is the trained plan's (the file's original statistics would score otherwise).
if $MEMC export "$PLAN" --weights "$TMP/ck" -o "$TMP/trained.onnx" >"$TMP/out" 2>"$TMP/err" &&
   grep -q "with 19 trained weights" "$TMP/out"; then
  pass "export: $(cat "$TMP/out")"
else fail "export: $(cat "$TMP/out") $(cat "$TMP/err")"; fi
$MEMC compile "$TMP/trained.onnx" --batch 4 --optimizer sgd --lr 0.05 -o "$TMP/trained.plan" >/dev/null 2>"$TMP/err" || fail "compile exported: $(cat "$TMP/err")"
if $MEMC run "$TMP/trained.plan" --eval data/digits_test.npz --quiet --json "$TMP/eval.json" >"$TMP/out" 2>"$TMP/err"; then
  python3 -c '
import json, sys
trained, exported = (json.load(open(p))["accuracy"] for p in sys.argv[1:3])
assert trained == exported, (trained, exported)
' "$TMP/report.json" "$TMP/eval.json" && pass "the exported model evaluates as the trained plan" || fail "accuracy of the export: $(cat "$TMP/eval.json")"
else fail "eval of the export: $(cat "$TMP/err")"; fi

expect_error 2 "2 micro-batches would each take the statistics of their own rows" -- \
  $MEMC compile models/bn_net_train_t215.onnx --batch 4 --micro-batches 2 -o "$TMP/mb.plan"
[ -e "$TMP/mb.plan" ] && fail "a refused compile wrote its plan"
finish
