#!/usr/bin/env bash
# Hostile data and plans (issue 14): non-finite inputs named by file, array and sample; empty
# eval sets refused before training; --steps beyond the schedule refused; divergence named by
# step with the --json report written ("status": "diverged"); an edited model or plan refused.
# Each refusal: exit 2, one line, no pre-existing file changed.
source "$(dirname "$0")/common.bash" "$@"
W="$TMP/w"
mkdir -p "$W" && cd "$W"
cp "$SRC/models/vit_tiny.onnx" m.onnx
cp "$SRC/data/digits_train.npz" train.npz
cp "$SRC/data/digits_test.npz" test.npz
$MEMC compile m.onnx --batch 8 --epochs 1 --steps-per-epoch 8 -o p.plan >/dev/null 2>&1 || fail "compile"
refused() {
  local before
  before=$(snapshot "$W")
  hostile "$@"
  [ "$before" = "$(snapshot "$W")" ] || fail "$* changed a file: $(diff <(echo "$before") <(snapshot "$W") | head -5)"
}

# Non-finite values: found at load, named by file, array and sample.
poison() {  # poison IN OUT VALUE SAMPLE
  npz_py '
a = read_npz(sys.argv[1]); d, s, v = a["x"]; v = list(v); per = len(v) // s[0]
v[int(sys.argv[4]) * per + 5] = float(sys.argv[3]); a["x"] = (d, s, v); write_npz(sys.argv[2], a)' "$@"
}
poison train.npz nan.npz nan 37
poison test.npz inf.npz inf 3
poison test.npz ninf.npz -inf 0
refused 2 "nan.npz: array 'x' sample 37 holds NaN" -- $MEMC run p.plan --data nan.npz --steps 1 --quiet
refused 2 "inf.npz: array 'x' sample 3 holds +inf" -- $MEMC run p.plan --eval inf.npz --quiet
refused 2 "ninf.npz: array 'x' sample 0 holds -inf" -- $MEMC run p.plan --data train.npz --eval ninf.npz --checkpoint ck1 --quiet
[ ! -e ck1/checkpoint.safetensors ] && pass "bad eval data refused before training" || fail "trained before refusing the eval data"
refused 2 "sample 3 holds +inf" -- $MEMC infer m.onnx --input inf.npz -o out.npz

# An empty eval set: refused at load, before any training or checkpoint.
npz_py 'write_npz(sys.argv[1], {"x": ("<f4", (0, 1, 8, 8), []), "y": ("<i8", (0,), [])})' empty.npz
refused 2 "empty.npz: has 0 samples" -- $MEMC run p.plan --data train.npz --eval empty.npz --checkpoint ck2 --json r.json --quiet
[ ! -e ck2/checkpoint.safetensors ] && [ ! -e r.json ] && pass "nothing written for an empty eval set" || fail "wrote after an empty eval set"
refused 2 "make no batch" -- $MEMC run p.plan --data empty.npz --quiet

# --steps beyond the schedule (8 steps): refused, never capped; within it: exact.
refused 2 "--steps 20: the schedule has 8 steps" -- $MEMC run p.plan --data train.npz --steps 20 --quiet
$MEMC run p.plan --data train.npz --steps 5 --checkpoint ck3 --json s.json --quiet >/dev/null 2>&1 || fail "run 5 steps"
refused 2 "5 of them done; ask for at most 3" -- $MEMC run p.plan --data train.npz --steps 4 --checkpoint ck3 --resume --quiet
refused 2 "--steps 20: the schedule has 8 steps (1 epoch(s) of 8 batches of 8 from train.npz), 5 of them done; ask for at most 3" -- $MEMC run p.plan --data train.npz --steps 20 --checkpoint ck3 --resume --quiet
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["steps"] == 5 and d["status"] == "ok", d
assert d["process_peak_rss_bytes"] > 0 and d["host_memory"]["gemm_threads"] >= 1, d
' s.json && pass "5 steps done as asked; status ok, process_peak_rss_bytes reported" || fail "s.json: $(head -c 300 s.json)"
$MEMC run p.plan --data train.npz --steps 8 --epochs 2 --quiet >/dev/null 2>"$TMP/err"; [ $? -eq 2 ] && pass "--steps with --epochs refused" || fail "--steps --epochs"
$MEMC run p.plan --data train.npz --epochs 3 --json e.json --quiet >/dev/null 2>&1 && python3 -c '
import json, sys; d = json.load(open(sys.argv[1])); assert d["steps"] == 24, d' e.json && pass "--epochs 3 extends the schedule to 24 steps" || fail "--epochs 3"

# Divergence: named by step; the --json report is written with "status": "diverged".
$MEMC compile m.onnx --batch 32 --precision fp16-true --optimizer sgd --lr 1e4 -o nan.plan >/dev/null 2>&1
hostile 2 "training diverged" -- $MEMC run nan.plan --data train.npz --steps 20 --checkpoint ck4 --json d.json --quiet
grep -q "step [0-9]*:" "$TMP/err" || fail "divergence names no step: $(cat "$TMP/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["status"] == "diverged" and d["diverged_step"] >= 1 and "diverged" in d["error"], d
assert d["steps"] == d["diverged_step"] - 1, d
' d.json && pass "diverged run wrote its --json report" || fail "d.json: $(head -c 400 d.json 2>&1)"
[ ! -e ck4/checkpoint.safetensors ] && pass "no checkpoint from the diverged step" || fail "checkpoint after NaN"

# The model a plan reads, edited in place at the same size: run and export refuse it.
$MEMC run p.plan --data train.npz --steps 1 --checkpoint ck5 --quiet >/dev/null 2>&1 || fail "run"
cp m.onnx m.orig
python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) - 40] ^= 0x08; open(p, "wb").write(b)' m.onnx
refused 2 "changed since the plan was compiled" -- $MEMC run p.plan --data train.npz --steps 1 --quiet
refused 2 "changed since the plan was compiled" -- $MEMC export p.plan --weights ck5 -o out.onnx
cp m.orig m.onnx

# External data: recorded with its checksum; an edit is refused naming the file, and no
# output may land on it.
cp "$SRC/models/vit_tiny_dynamo.onnx" "$SRC/models/vit_tiny_dynamo.onnx.data" .
$MEMC compile vit_tiny_dynamo.onnx --batch 8 --epochs 1 --steps-per-epoch 8 -o dyn.plan >/dev/null 2>&1 || fail "compile dynamo"
python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))["model"]["external_data"]
assert [d["path"] for d in e] == ["vit_tiny_dynamo.onnx.data"] and len(e[0]["crc32c"]) == 8, e
' dyn.plan && pass "the plan records the external data with its checksum" || fail "dyn.plan external_data"
refused 2 "same file as the input" -- $MEMC compile vit_tiny_dynamo.onnx --batch 8 -o vit_tiny_dynamo.onnx.data --force
refused 2 "same file as the input" -- $MEMC run dyn.plan --data train.npz --steps 1 --json vit_tiny_dynamo.onnx.data --force --quiet
cp vit_tiny_dynamo.onnx.data data.orig
python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[100] ^= 0x01; open(p, "wb").write(b)' vit_tiny_dynamo.onnx.data
refused 2 "vit_tiny_dynamo.onnx.data: changed since the plan was compiled" -- $MEMC run dyn.plan --data train.npz --steps 1 --quiet
cp data.orig vit_tiny_dynamo.onnx.data
timeout 60 $MEMC run dyn.plan --data train.npz --steps 1 --quiet >/dev/null 2>"$TMP/err" && pass "restored external data runs" || fail "dyn run: $(cat "$TMP/err")"

# Plans: another format version, edited fields.
sed 's/"format_version": 2/"format_version": 1/' p.plan >v1.plan
refused 2 "recompile" -- $MEMC run v1.plan --data train.npz --steps 1 --quiet
for edit in 's/"batch": 8/"batch": -8/' 's/"crc32c": "[0-9a-f]*"/"crc32c": "nothex!!"/' 's/"kind": "adamw"/"kind": "adamz"/' \
            's/"micro_batches": 1/"micro_batches": 0/' 's/"epochs": 1,/"epochs": -1,/' 's/"lr": [0-9.e-]*/"lr": -1.0/' \
            's/"threads": [0-9]*/"threads": -3/' 's/"bf16_gemm": "[a-z]*"/"bf16_gemm": "fast"/'; do
  sed "$edit" p.plan >edited.plan
  cmp -s p.plan edited.plan && { fail "edit $edit changed nothing"; continue; }
  refused 2 "edited.plan: " -- $MEMC run edited.plan --data train.npz --steps 1 --quiet
done
finish
