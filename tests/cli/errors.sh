#!/usr/bin/env bash
# Bad input: one line on stderr ("memc: ..."), exit 2, never a crash, and an existing output
# file is left untouched when infer fails.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"
M=models/vit_tiny.onnx
REF=models/vit_tiny.ref.npz
OUT="$TMP/out.npz"

# Flags and commands.
expect_error 2 "memc --help" -- $MEMC
expect_error 2 "frobnicate" -- $MEMC frobnicate $M
expect_error 2 "--frobnicate" -- $MEMC inspect $M --frobnicate
expect_error 2 "--batch" -- $MEMC inspect $M --batch 0
expect_error 2 "--batch" -- $MEMC inspect $M --batch abc
expect_error 2 "--input" -- $MEMC infer $M -o $OUT
expect_error 2 "MODEL" -- $MEMC inspect
expect_error 2 "--loss-chunks 'many': expected none, auto or a count ≥ 1" -- $MEMC compile $M --batch 4 --loss-chunks many -o "$TMP/x.plan"
expect_error 2 "--loss-chunks '0'" -- $MEMC compile $M --batch 4 --loss-chunks 0 -o "$TMP/x.plan"
expect_error 2 "--loss-chunks 2: the logits '" -- $MEMC compile $M --batch 4 --loss-chunks 2 -o "$TMP/x.plan"

# Model files.
expect_error 2 "/nonexistent/m.onnx" -- $MEMC inspect /nonexistent/m.onnx
expect_error 2 "is not an ONNX model" -- $MEMC inspect $REF
head -c 1500 $M >"$TMP/truncated.onnx"
expect_error 2 "truncated.onnx" -- $MEMC inspect "$TMP/truncated.onnx"
printf 'this is not a protobuf at all \x01\x02\xff\xfe garbage garbage\n' >"$TMP/garbage.onnx"
expect_error 2 "garbage.onnx" -- $MEMC inspect "$TMP/garbage.onnx"
: >"$TMP/empty.onnx"
expect_error 2 "empty.onnx" -- $MEMC inspect "$TMP/empty.onnx"
expect_error 2 "Det" -- $MEMC inspect tests/data/unsupported_op.onnx
grep -q "det0" "$TMP/err" || fail "unsupported op message names no node: $(cat "$TMP/err")"
grep -q "17" "$TMP/err" || fail "unsupported op message names no opset: $(cat "$TMP/err")"

# infer: every failure leaves an existing output file as it was.
echo "keep me" >"$OUT"
expect_error 2 "skeleton" -- $MEMC infer models/vit_b_16_skeleton.onnx --input $REF -o "$OUT" --force
expect_error 2 "/nonexistent/in.npz" -- $MEMC infer $M --input /nonexistent/in.npz -o "$OUT" --force
expect_error 2 "$TMP/garbage.onnx" -- $MEMC infer $M --input "$TMP/garbage.onnx" -o "$OUT" --force
npz_py 'write_npz(sys.argv[1], {"x": ("<f4", (4, 1, 8, 9), [0.0] * 288)})' "$TMP/shape.npz"
expect_error 2 "expected f32[4x1x8x8], got f32[4x1x8x9]" -- $MEMC infer $M --input "$TMP/shape.npz" -o "$OUT" --force
npz_py 'write_npz(sys.argv[1], {"x": ("<f8", (4, 1, 8, 8), [0.0] * 256)})' "$TMP/dtype.npz"
expect_error 2 "expected f32[4x1x8x8], got f64[4x1x8x8]" -- $MEMC infer $M --input "$TMP/dtype.npz" -o "$OUT" --force
npz_py 'write_npz(sys.argv[1], {"pixels": ("<f4", (4, 1, 8, 8), [0.0] * 256), "y": ("<i8", (4,), [0] * 4)})' "$TMP/names.npz"
expect_error 2 "no array for model input 'x'" -- $MEMC infer $M --input "$TMP/names.npz" -o "$OUT" --force
expect_error 2 "does not exist" -- $MEMC infer $M --input $REF -o /nonexistent/dir/out.npz
expect_error 2 "is a directory" -- $MEMC infer $M --input $REF -o "$TMP"
[ "$(cat "$OUT")" = "keep me" ] && pass "output file untouched by failures" || fail "output file was modified"
ls "$TMP" | grep -q '\.tmp\.' && fail "temporary files left behind: $(ls "$TMP")"
# The interconnect of a GPU prediction (planner/cost_model.h set_interconnect).
expect_error 2 "--interconnect ethernet: not nvlink or ib" -- $MEMC compile $M --batch 8 --devices 2 --target h200 --interconnect ethernet -o "$TMP/i.plan"
expect_error 2 "--target cpu is not a GPU" -- $MEMC compile $M --batch 8 --devices 2 --interconnect nvlink -o "$TMP/i.plan"
expect_error 2 "--gpus-per-node goes with --interconnect nvlink" -- $MEMC compile $M --batch 8 --devices 2 --target h200 --gpus-per-node 4 -o "$TMP/i.plan"
expect_error 2 "--gpus-per-node" -- $MEMC compile $M --batch 8 --devices 2 --target h200 --interconnect nvlink --gpus-per-node 0 -o "$TMP/i.plan"
expect_error 2 "--disable-pass: 'precision' is not an optional pass; these are: patch_gemm," -- $MEMC compile $M --batch 8 --target h200 --disable-pass fuse_elementwise,precision -o "$TMP/i.plan"
MEMC_DISABLE_PASSES=fuse_elemntwise expect_error 2 "MEMC_DISABLE_PASSES: 'fuse_elemntwise' is not an optional pass" -- $MEMC compile $M --batch 8 -o "$TMP/i.plan"
[[ ! -e $TMP/i.plan ]] || fail "a refused compile wrote its plan"
finish
