#!/usr/bin/env bash
# memc inspect: text, --json, --print-ir, skeleton parameter counts, --help everywhere.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"

for args in "--help" "inspect --help" "infer --help"; do
  if $MEMC $args >"$TMP/help" 2>"$TMP/err" && grep -q "Usage" "$TMP/help" && [ ! -s "$TMP/err" ]; then
    pass "memc $args"
  else fail "memc $args: $(head -c 300 "$TMP/err")"; fi
done

if $MEMC inspect models/vit_tiny.onnx --batch 2 >"$TMP/text" 2>"$TMP/err"; then
  for key in "input      x  f32[2x1x8x8]" "output     logits  f32[2x10]" "params" "nodes" "forward" "ops" "opset      17"; do
    grep -qF "$key" "$TMP/text" || fail "inspect text lacks '$key': $(cat "$TMP/text")"
  done
  pass "inspect vit_tiny (text)"
else fail "inspect vit_tiny: $(cat "$TMP/err")"; fi

if $MEMC inspect models/vit_tiny.onnx --batch 5 --json >"$TMP/json" 2>"$TMP/err"; then
  python3 - "$TMP/json" <<'PY' && pass "inspect vit_tiny --json" || fail "inspect --json content"
import json, sys
j = json.load(open(sys.argv[1]))
for k in ["model", "inputs", "outputs", "op_histogram", "param_count", "param_bytes", "nodes",
          "forward_flops", "opset", "producer", "skeleton"]:
    assert k in j, k
assert j["inputs"][0]["name"] == "x" and j["inputs"][0]["shape"] == [5, 1, 8, 8], j["inputs"]
assert j["outputs"][0]["shape"] == [5, 10], j["outputs"]
assert j["param_count"] > 0 and j["param_bytes"] == 4 * j["param_count"], j["param_count"]
assert j["skeleton"] is False and j["opset"] == 17 and j["forward_flops"] > 0
assert sum(j["op_histogram"].values()) == j["nodes"]
PY
else fail "inspect --json: $(cat "$TMP/err")"; fi

if $MEMC inspect models/vit_tiny.onnx --print-ir >"$TMP/ir" 2>"$TMP/err" && grep -q "func.func @main" "$TMP/ir" &&
   grep -q '"func.return"' "$TMP/ir"; then pass "inspect --print-ir"
else fail "inspect --print-ir: $(head -c 300 "$TMP/err")"; fi

# The issue's figures: exact torchvision parameter counts from skeleton exports, in seconds.
for pair in "vit_b_16_skeleton:86567656" "vit_l_16_skeleton:304326632"; do
  name=${pair%%:*}; want=${pair##*:}
  [ -f "models/$name.onnx" ] || { echo "skip: models/$name.onnx absent"; continue; }
  start=$(date +%s)
  if $MEMC inspect "models/$name.onnx" --batch 16 --json >"$TMP/sk" 2>"$TMP/err"; then
    secs=$(( $(date +%s) - start ))
    python3 -c "
import json, sys
j = json.load(open('$TMP/sk'))
assert j['param_count'] == $want, j['param_count']
assert j['skeleton'] is True
assert j['inputs'][0]['shape'][0] == 16
" && pass "$name: $want params at batch 16 in ${secs}s" || fail "$name param count: $(grep param_count "$TMP/sk")"
    [ "$secs" -le 30 ] || fail "$name: inspect took ${secs}s"
  else fail "inspect $name: $(cat "$TMP/err")"; fi
done
finish
