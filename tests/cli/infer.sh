#!/usr/bin/env bash
# memc infer reproduces PyTorch's logits (models/*.ref*.npz) through the CLI, at the exported
# batch and at batch 3 (a BatchNorm exported in train() infers with its running statistics, as
# the module in eval(): infer/logits), and --print names a class per sample.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"

check_infer() {  # MODEL REF [extra flags]
  local model=$1 ref=$2; shift 2
  [ -f "$model" ] && [ -f "$ref" ] || { echo "skip: $model or $ref absent"; return; }
  local out="$TMP/$(basename "$ref" .npz).out.npz"
  if ! $MEMC infer "$model" --input "$ref" -o "$out" "$@" >"$TMP/stdout" 2>"$TMP/err"; then
    fail "infer $model $ref: $(cat "$TMP/err")"; return
  fi
  grep -q "^memc infer: .* ms$" "$TMP/stdout" || fail "infer summary line: $(head -3 "$TMP/stdout")"
  if npz_py '
ref, out = read_npz(sys.argv[1]), read_npz(sys.argv[2])
assert "logits" in out, sorted(out)
_, shape, got = out["logits"]
_, want_shape, want = ref.get("infer/logits", ref["logits"])  # a train() export infers as in eval()
assert shape == want_shape, (shape, want_shape)
err = rel_error(got, want)
print("rel error %.3g" % err)
assert err <= 1e-4, err
' "$ref" "$out" >"$TMP/cmp" 2>&1; then pass "infer $model $(basename "$ref"): $(cat "$TMP/cmp")"
  else fail "infer $model $(basename "$ref") logits: $(tail -2 "$TMP/cmp")"; fi
}

for ref in models/*.ref.npz models/*.ref_b3.npz; do
  name=$(basename "$ref"); name=${name%%.ref*}
  check_infer "models/$name.onnx" "$ref"
done

# The README's command: one predicted class per sample, checked against the reference labels.
if $MEMC infer models/vit_tiny.onnx --input models/vit_tiny.ref.npz -o "$TMP/p.npz" --print >"$TMP/print" 2>"$TMP/err"; then
  rows=$(grep -c '^logits\[[0-9]*\]: class [0-9]' "$TMP/print")
  [ "$rows" -eq 4 ] && pass "infer --print: $rows samples" || fail "infer --print: $(cat "$TMP/print")"
else fail "infer --print: $(cat "$TMP/err")"; fi

# A single-input model also accepts the key x; the batch follows the arrays (5 here).
npz_py 'write_npz(sys.argv[1], {"x": ("<f4", (5, 1, 8, 8), [0.01 * i for i in range(320)])})' "$TMP/x5.npz"
if $MEMC infer models/vit_tiny.onnx --input "$TMP/x5.npz" -o "$TMP/y5.npz" >/dev/null 2>"$TMP/err" &&
   npz_py 'assert read_npz(sys.argv[1])["logits"][1] == (5, 10)' "$TMP/y5.npz"; then pass "infer batch 5 from key x"
else fail "infer batch 5: $(cat "$TMP/err")"; fi
# Outputs the model computed as NaN are written as they are, with one warning line saying so.
LOG_MODEL=/usr/share/libonnx-testdata/data/node/test_log/model.onnx
if [ -f "$LOG_MODEL" ]; then
  npz_py 'write_npz(sys.argv[1], {"x": ("<f4", (3, 4, 5), [-1.0 if i % 7 == 0 else 1.0 + i for i in range(60)])})' "$TMP/neg.npz"
  if $MEMC infer "$LOG_MODEL" --input "$TMP/neg.npz" -o "$TMP/log.npz" >/dev/null 2>"$TMP/err"; then
    grep -q "^memc: warning: output 'y' holds 9 NaN or infinite values of 60 (the first in row 0)" "$TMP/err" &&
      [ "$(grep -c . "$TMP/err")" -eq 1 ] && pass "infer warns of NaN outputs in one line" || fail "infer NaN warning: $(cat "$TMP/err")"
  else fail "infer of a NaN output failed: $(cat "$TMP/err")"; fi
else echo "skip: $LOG_MODEL absent"; fi
finish
