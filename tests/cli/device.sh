# memc run --device: the Backend seam's choice of backend. Without a usable GPU (this machine,
# CI) `--device cuda` is one line and exit 2; a plan for h200 runs on the CPU by default, and the
# report says which backend ran it.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"
$MEMC compile models/vit_tiny.onnx --batch 8 --target h200 -o "$TMP/h.plan" >/dev/null 2>"$TMP/err" || fail "compile: $(cat "$TMP/err")"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  pass "a GPU is present: the no-device checks do not apply here"
else
  expect_error 2 "--device cuda:0" -- $MEMC run "$TMP/h.plan" --data data/digits_train.npz --steps 1 --device cuda
  expect_error 2 "--device cuda:3" -- $MEMC run "$TMP/h.plan" --data data/digits_train.npz --steps 1 --device cuda:3
fi
expect_error 2 "cpu, cuda or cuda:K" -- $MEMC run "$TMP/h.plan" --data data/digits_train.npz --steps 1 --device tpu
$MEMC run "$TMP/h.plan" --data data/digits_train.npz --steps 2 --quiet --json "$TMP/r.json" >"$TMP/out" 2>"$TMP/err" || fail "run: $(cat "$TMP/err")"
python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["device"] in ("cpu", "cuda:0"), r["device"]
# run state 256 B + cuBLASLt 32 MiB + attention_grad through GEMMs: two f32 score chunks of
# 8 images * 2 heads * 17 * 17 (18,496 B in a 256-byte piece each), more than the patch
# convolution needs for im2col and dy transposed (18,432 B)
assert r["target"] == "h200" and r["breakdown"]["workspace"] == 256 + (32 << 20) + 2 * 18688, r
' "$TMP/r.json" && pass "an h200 plan runs on the CPU backend by default and reports it" || fail "report: $(head -c 300 "$TMP/r.json")"
grep -q "measured on cpu" "$TMP/out" && grep -q "planned for h200 (kernel workspaces differ" "$TMP/out" \
  && pass "the summary says the plan's workspaces are h200's, not the CPU's" || fail "summary: $(cat "$TMP/out")"
$MEMC run "$TMP/h.plan" --data data/digits_train.npz --steps 1 --quiet --device cpu >/dev/null 2>"$TMP/err" \
  && pass "--device cpu" || fail "--device cpu: $(cat "$TMP/err")"
finish
