#!/usr/bin/env bash
# memc compile / run / export / inspect PLAN end to end on the digits ViT, and the bad inputs
# of training: data, plans and checkpoints that are wrong get one line and exit 2, and
# nothing already on disk is overwritten.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"

PLAN="$TMP/vit.plan"
if $MEMC compile models/vit_tiny.onnx --batch 32 --optimizer adamw --lr 2e-3 --schedule warmup-cosine \
     --warmup-steps 10 --epochs 1 -o "$PLAN" >"$TMP/out" 2>"$TMP/err"; then pass "compile"
else fail "compile: $(cat "$TMP/err")"; fi
grep -q "^decisions  precision fp32" "$TMP/out" || fail "compile summary: $(cat "$TMP/out")"

$MEMC inspect "$PLAN" --json >"$TMP/inspect.json" 2>"$TMP/err" || fail "inspect PLAN: $(cat "$TMP/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["param_count"] == 18218, d["param_count"]
assert d["decisions"]["precision"] == "fp32" and d["optimizer"] == "adamw", d
' "$TMP/inspect.json" && pass "inspect PLAN --json" || fail "inspect PLAN json: $(head -c 300 "$TMP/inspect.json")"

# Train a few steps with a checkpoint, dump the first gradients, write a report.
if $MEMC run "$PLAN" --data data/digits_train.npz --eval data/digits_test.npz --steps 5 --quiet \
     --checkpoint "$TMP/ck" --dump-grads "$TMP/grads.npz" --json "$TMP/report.json" >"$TMP/out" 2>"$TMP/err"; then
  pass "run: $(tr '\n' ' ' <"$TMP/out")"
else fail "run: $(cat "$TMP/err")"; fi
python3 -c '
import json, math, sys
d = json.load(open(sys.argv[1]))
assert d["steps"] == 5 and len(d["losses"]) == 5, d
assert all(math.isfinite(l) for l in d["losses"]), d["losses"]
assert 0 <= d["accuracy"] <= 1 and d["step_ms"] > 0, d
assert d["loop_step_ms"] >= d["step_ms"], d  # each step timed with its batch assembly too
for key in ("loss", "decisions", "samples_per_s"): assert key in d, key
' "$TMP/report.json" && pass "run --json report" || fail "report: $(head -c 400 "$TMP/report.json")"
npz_py '
g = read_npz(sys.argv[1])
assert "loss" in g and "class_token" in g and "heads.head.weight" in g, sorted(g)
assert len(g) == 33, len(g)   # loss + 32 parameters, keyed by initializer name
' "$TMP/grads.npz" && pass "--dump-grads keys" || fail "--dump-grads: $(ls -l "$TMP")"
[ -f "$TMP/ck/checkpoint.safetensors" ] && pass "checkpoint written" || fail "no checkpoint"

# Export the trained weights; the exported model runs in memc infer (ONNX Runtime: models/check_export.py).
if $MEMC export "$PLAN" --weights "$TMP/ck" -o "$TMP/trained.onnx" >"$TMP/out" 2>"$TMP/err" &&
   $MEMC infer "$TMP/trained.onnx" --input models/vit_tiny.ref.npz -o "$TMP/trained_out.npz" >/dev/null 2>"$TMP/err"; then
  pass "export + infer on the exported model"
else fail "export: $(cat "$TMP/err")"; fi
npz_py '
a, b = read_npz(sys.argv[1])["logits"][2], read_npz(sys.argv[2])["logits"][2]
assert max(abs(x - y) for x, y in zip(a, b)) > 1e-4, "export wrote the untrained weights"
' "$TMP/trained_out.npz" models/vit_tiny.ref.npz && pass "exported weights are the trained ones" || fail "exported weights unchanged"

# The bf16 GEMM path (native or widened to f32, measured per CPU): compile records the one its
# workspaces were sized for, run pins it, so measured = planned; a plan edited to the other path
# runs that path (native only where this CPU can: else one warning line).
$MEMC compile models/vit_tiny.onnx --batch 32 --precision bf16-mixed -o "$TMP/bf16.plan" >/dev/null 2>"$TMP/err" || fail "bf16 compile: $(cat "$TMP/err")"
recorded=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["bf16_gemm"])' "$TMP/bf16.plan")
for path in "$recorded" $([ "$recorded" = native ] && echo widened || echo native); do
  sed "s/\"bf16_gemm\": \"$recorded\"/\"bf16_gemm\": \"$path\"/" "$TMP/bf16.plan" >"$TMP/bf16_$path.plan"
  $MEMC run "$TMP/bf16_$path.plan" --data data/digits_train.npz --steps 2 --quiet --json "$TMP/bf16_$path.json" >/dev/null 2>"$TMP/err" ||
    fail "bf16 run ($path): $(cat "$TMP/err")"
  python3 -c '
import json, sys
d, path, recorded, warning = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4]
library = d["host_memory"]["gemm_library"]
ran = "native" if "bf16 GEMMs native" in library else "widened"
assert path in ("native", "widened"), path
if warning: assert path == "native" and ran == "widened" and "cannot run them natively" in warning, (path, ran, warning)
else: assert ran == path, (path, library)
if path == recorded: assert d["measured_peak_bytes"] == d["predicted_peak_bytes"], d
' "$TMP/bf16_$path.json" "$path" "$recorded" "$(cat "$TMP/err")" && pass "bf16 GEMMs $path (recorded: $recorded)" || fail "bf16 path $path: $(cat "$TMP/err")"
done

# How idle OpenMP threads wait (runtime/preinit/preinit.cc): the user's setting is kept and reported;
# otherwise memc chose a bounded spin or passive.
for setting in "GOMP_SPINCOUNT=1234:spin 1234" "OMP_WAIT_POLICY=passive:passive" ":"; do
  env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY ${setting%%:*} $MEMC run "$PLAN" --data data/digits_train.npz --steps 1 --quiet --force --json "$TMP/wait.json" >/dev/null 2>"$TMP/err" ||
    fail "run (${setting%%:*}): $(cat "$TMP/err")"
  python3 -c '
import json, sys
got, want = json.load(open(sys.argv[1]))["host_memory"]["omp_wait"], sys.argv[2]
assert got == want if want else got in ("passive", "spin 30000"), (got, want)
' "$TMP/wait.json" "${setting#*:}" && pass "omp_wait with '${setting%%:*}'" || fail "omp_wait ${setting%%:*}: $(head -c 300 "$TMP/wait.json")"
done

# Bad data: missing arrays, wrong dtype, labels out of range.
expect_error 2 "no array 'y'" -- $MEMC run "$PLAN" --data models/vit_tiny.ref.npz --steps 1 --quiet
npz_py '
x = read_npz(sys.argv[1])["x"]
write_npz(sys.argv[2], {"x": x, "y": ("<i8", (4,), (0, 1, 2, 10))})
write_npz(sys.argv[3], {"x": ("<i8", x[1], tuple(0 for _ in x[2])), "y": ("<i8", (4,), (0, 1, 2, 3))})
write_npz(sys.argv[4], {"x": ("<f4", (4, 1, 4, 4), tuple(0.0 for _ in range(64))), "y": ("<i8", (4,), (0, 1, 2, 3))})
' models/vit_tiny.ref.npz "$TMP/badlabel.npz" "$TMP/baddtype.npz" "$TMP/badshape.npz"
expect_error 2 "outside [0, 10)" -- $MEMC run "$PLAN" --data "$TMP/badlabel.npz" --steps 1 --quiet
expect_error 2 "needs f32" -- $MEMC run "$PLAN" --data "$TMP/baddtype.npz" --steps 1 --quiet
expect_error 2 "has shape" -- $MEMC run "$PLAN" --data "$TMP/badshape.npz" --steps 1 --quiet

# Bad plans: truncated, another format version, not a plan.
head -c 500 "$PLAN" >"$TMP/truncated.plan"
expect_error 2 "truncated" -- $MEMC run "$TMP/truncated.plan" --data data/digits_train.npz
sed 's/"format_version": 2/"format_version": 99/' "$PLAN" >"$TMP/future.plan"
expect_error 2 "recompile" -- $MEMC run "$TMP/future.plan" --data data/digits_train.npz
expect_error 2 "not a memc plan" -- $MEMC run models/vit_tiny.onnx --data data/digits_train.npz

# Bad checkpoints: corrupt, or of another model; the file on disk stays as it was.
mkdir -p "$TMP/bad_ck"
printf '\x40\x00\x00\x00\x00\x00\x00\x00{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}' >"$TMP/bad_ck/checkpoint.safetensors"
before=$(md5sum <"$TMP/bad_ck/checkpoint.safetensors")
expect_error 2 "checkpoint.safetensors" -- $MEMC run "$PLAN" --data data/digits_train.npz --steps 1 --checkpoint "$TMP/bad_ck" --resume --quiet
[ "$before" = "$(md5sum <"$TMP/bad_ck/checkpoint.safetensors")" ] && pass "corrupt checkpoint untouched" || fail "checkpoint overwritten"
$MEMC compile models/text_encoder.onnx --batch 4 --seq 32 -o "$TMP/text.plan" >/dev/null 2>&1
expect_error 2 "no tensor" -- $MEMC run "$TMP/text.plan" --data data/text_train.npz --steps 1 --checkpoint "$TMP/ck" --resume --quiet

# A fresh run never overwrites an existing checkpoint.
before=$(md5sum <"$TMP/ck/checkpoint.safetensors")
expect_error 2 "pass --resume" -- $MEMC run "$PLAN" --data data/digits_train.npz --steps 1 --checkpoint "$TMP/ck" --quiet
[ "$before" = "$(md5sum <"$TMP/ck/checkpoint.safetensors")" ] && pass "existing checkpoint untouched" || fail "checkpoint overwritten"

# A budget the plan cannot meet: exit 3 before anything runs, one line with the budget, the
# peak, the lower bound and the largest category; no plan is written.
# With every decision pinned, a budget the pinned plan exceeds is refused as it stands.
expect_error 3 "largest at the peak: activations" -- $MEMC compile models/vit_tiny.onnx --batch 64 --budget 1MB --precision fp32 \
  --micro-batches 1 --remat none --offload none --attention tiled -o "$TMP/over.plan"
[ ! -e "$TMP/over.plan" ] && pass "no plan written over budget" || fail "a plan was written over budget"
# Unpinned, the search fits 1 MB; below the floor it names the smallest peak it can reach.
$MEMC compile models/vit_tiny.onnx --batch 64 --budget 1MB -o "$TMP/searched.plan" --json >"$TMP/searched.json" 2>"$TMP/err" \
  && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["predicted_peak_bytes"] <= 10**6, d' "$TMP/searched.json" \
  && pass "the search fits --budget 1MB" || fail "search at 1MB: $(cat "$TMP/err")"
expect_error 3 "below the smallest peak memc can plan for this model, batch and optimizer" -- \
  $MEMC compile models/vit_tiny.onnx --batch 64 --budget 100KB -o "$TMP/over.plan"
[ ! -e "$TMP/over.plan" ] && pass "no plan written below the floor" || fail "a plan was written below the floor"
# The floor compares scheduled peaks: streamed parameters fall most when scheduled (ViT-L/16 at
# batch 8 was refused at 500 MB, "floor 888 MB with offload optimizer", though offload params
# plans 410 MB).
$MEMC compile models/vit_l_16_skeleton.onnx --batch 8 --target h200 --budget 500MB -o "$TMP/vitl8.plan" --json >"$TMP/vitl8.json" 2>"$TMP/err" \
  && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["predicted_peak_bytes"] <= 500e6 and d["decisions"]["offload"] == "params", d["decisions"]' "$TMP/vitl8.json" \
  && pass "ViT-L/16 b8 fits --budget 500MB by streaming its parameters" || fail "ViT-L/16 b8 at 500MB: $(cat "$TMP/err")"
expect_error 2 "unknown unit" -- $MEMC compile models/vit_tiny.onnx --batch 64 --budget 6XB -o "$TMP/over.plan"
if $MEMC compile models/vit_tiny.onnx --batch 64 --budget 6MiB --json -o "$TMP/fits.plan" >"$TMP/fits.json" 2>"$TMP/err"; then
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["predicted_peak_bytes"] <= 6 * 2**20 == d["budget_bytes"], d
assert sum(d["breakdown"].values()) == d["lower_bound_bytes"] <= d["predicted_peak_bytes"], d
for k in ("params", "grads", "optimizer_state", "master_weights", "activations", "workspace"): assert k in d["breakdown"], k
' "$TMP/fits.json" && pass "compile --budget --json fields" || fail "compile json: $(head -c 400 "$TMP/fits.json")"
else fail "compile within budget: $(cat "$TMP/err")"; fi
$MEMC run "$TMP/fits.plan" --data data/digits_train.npz --steps 2 --quiet --json "$TMP/fits_run.json" >/dev/null 2>"$TMP/err" || fail "run: $(cat "$TMP/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["measured_peak_bytes"] == d["predicted_peak_bytes"], d
' "$TMP/fits_run.json" && pass "run --json measured = predicted" || fail "run json: $(head -c 400 "$TMP/fits_run.json")"

# A diverging run stops at the first non-finite loss with one line, exit 2, and writes no checkpoint.
$MEMC compile models/vit_tiny.onnx --batch 32 --precision fp16-true --optimizer sgd --lr 1e4 -o "$TMP/nan.plan" >/dev/null 2>&1
expect_error 2 "the loss is" -- $MEMC run "$TMP/nan.plan" --data data/digits_train.npz --steps 20 --checkpoint "$TMP/nan_ck" --quiet
[ ! -e "$TMP/nan_ck/checkpoint.safetensors" ] && pass "no checkpoint from a diverged run" || fail "checkpoint written after NaN"

# Bad flags.
expect_error 2 "precision" -- $MEMC compile models/vit_tiny.onnx --batch 4 --precision fp8-mixed -o "$TMP/x.plan"

# fp16-mixed: dynamic loss scaling, reported by run --json.
$MEMC compile models/vit_tiny.onnx --batch 16 --precision fp16-mixed -o "$TMP/fp16m.plan" >/dev/null 2>&1 || fail "compile fp16-mixed"
$MEMC run "$TMP/fp16m.plan" --data data/digits_train.npz --steps 3 --quiet --json "$TMP/fp16m.json" >/dev/null 2>"$TMP/err" || fail "run fp16-mixed: $(cat "$TMP/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["skipped_steps"] == 0 and d["loss_scale"] == 65536, d
assert d["decisions"]["precision"] == "fp16-mixed", d
' "$TMP/fp16m.json" && pass "fp16-mixed run --json reports skipped_steps and loss_scale" || fail "fp16-mixed json: $(head -c 400 "$TMP/fp16m.json")"
expect_error 2 "--batch" -- $MEMC compile models/vit_tiny.onnx -o "$TMP/x.plan"
expect_error 2 "schedule" -- $MEMC compile models/vit_tiny.onnx --batch 4 --schedule linear -o "$TMP/x.plan"
finish
