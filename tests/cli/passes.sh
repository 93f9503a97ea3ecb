# Memory-pass flags of memc compile: --micro-batches, --remat, --attention, --offload, the budget
# search (--budget, --explain, --target, memc calibrate), and the pass dumps
# (--print-ir-after-all, --print-ir-after, --dump-dir) and -v pass reports.
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

# --remat: per-block checkpointing and a byte limit; gradients equal the plan without remat bit for bit.
$MEMC run "$TMP/one.plan" --data data/digits_train.npz --steps 1 --quiet --dump-grads "$TMP/g_none.npz" >/dev/null 2>"$TMP/err" || fail "run none: $(cat "$TMP/err")"
for r in blocks 200KB; do
  $MEMC compile models/vit_tiny.onnx --batch 16 --remat $r -o "$TMP/r.plan" --force --json >"$TMP/r.json" 2>"$TMP/err" || fail "compile --remat $r: $(cat "$TMP/err")"
  $MEMC run "$TMP/r.plan" --data data/digits_train.npz --steps 1 --quiet --dump-grads "$TMP/g_r.npz" --json "$TMP/rr.json" --force >/dev/null 2>"$TMP/err" || fail "run --remat $r: $(cat "$TMP/err")"
  npz_py '
a, b = read_npz(sys.argv[1]), read_npz(sys.argv[2])
assert sorted(a) == sorted(b) and all(a[k] == b[k] for k in a), "gradients differ"
import json
d = json.load(open(sys.argv[3]))
assert d["measured_peak_bytes"] == d["predicted_peak_bytes"], d
' "$TMP/g_none.npz" "$TMP/g_r.npz" "$TMP/rr.json" && pass "--remat $r: bit-identical gradients, measured = planned peak" || fail "--remat $r"
done
expect_error 2 "--remat" -- $MEMC compile models/vit_tiny.onnx --batch 4 --remat sometimes -o "$TMP/x.plan"
# A --remat size below what the solver can hold (the largest segment's tape): the least it can
# do, one warning line, and remat_limit_met false in the JSON; a size it meets: true, no warning.
$MEMC compile models/vit_tiny.onnx --batch 8 --optimizer sgd --remat 1KB -o "$TMP/u.plan" --json >"$TMP/u.json" 2>"$TMP/err" \
  || fail "compile --remat 1KB: $(cat "$TMP/err")"
[ "$(wc -l <"$TMP/err")" = 1 ] && grep -q '^memc: warning: --remat 1 KB is not met' "$TMP/err" \
  && pass "--remat 1KB: one warning line: $(cat "$TMP/err")" || fail "--remat 1KB warning: $(cat "$TMP/err")"
$MEMC compile models/vit_tiny.onnx --batch 8 --optimizer sgd --remat 100MB -o "$TMP/m.plan" --json >"$TMP/m.json" 2>"$TMP/err" \
  || fail "compile --remat 100MB: $(cat "$TMP/err")"
[ ! -s "$TMP/err" ] && pass "--remat 100MB: no warning" || fail "--remat 100MB warned: $(cat "$TMP/err")"
python3 -c '
import json, sys
unmet, met, none = (json.load(open(p)) for p in sys.argv[1:4])
assert unmet["remat_limit_met"] is False, unmet["remat_limit_met"]
assert met["remat_limit_met"] is True, met["remat_limit_met"]
assert none["remat_limit_met"] is None, none["remat_limit_met"]
' "$TMP/u.json" "$TMP/m.json" "$TMP/one.json" && pass "remat_limit_met: false, true, null (no --remat)" || fail "remat_limit_met json"

# --attention naive keeps the exported MatMul→Softmax→MatMul: a higher planned peak.
$MEMC compile models/bigbird_full.onnx --batch 8 --seq 32 --attention naive -o "$TMP/naive.plan" --json >"$TMP/naive.json" 2>"$TMP/err" || fail "naive: $(cat "$TMP/err")"
$MEMC compile models/bigbird_full.onnx --batch 8 --seq 32 -o "$TMP/tiled.plan" --json >"$TMP/tiled.json" 2>"$TMP/err" || fail "tiled: $(cat "$TMP/err")"
python3 -c '
import json, sys
naive, tiled = (json.load(open(p)) for p in sys.argv[1:3])
assert tiled["predicted_peak_bytes"] < naive["predicted_peak_bytes"], (tiled["predicted_peak_bytes"], naive["predicted_peak_bytes"])
' "$TMP/naive.json" "$TMP/tiled.json" && pass "--attention naive plans a higher peak than the tiled default" || fail "attention peaks"
grep -q 'memc.attention\\"' "$TMP/tiled.plan" && pass "tiled plan holds attention ops" || fail "no attention op in the tiled plan"
grep -q 'memc.attention\\"' "$TMP/naive.plan" && fail "attention op in the naive plan" || pass "naive plan holds no attention op"
expect_error 2 "--attention" -- $MEMC compile models/vit_tiny.onnx --batch 4 --attention flash -o "$TMP/x.plan"

# Pass dumps and reports.
$MEMC -v compile models/vit_tiny.onnx --batch 8 --micro-batches 2 --remat blocks --precision bf16-mixed --print-ir-after-all \
  --dump-dir "$TMP/dump" -o "$TMP/d.plan" >/dev/null 2>"$TMP/err" || fail "dump compile: $(head -c 300 "$TMP/err")"
[ "$(ls "$TMP/dump" | tr '\n' ' ')" = "00-import.mlir 01-attention.mlir 02-precision.mlir 03-training_step.mlir 04-accumulate_gemm.mlir 05-schedule.mlir " ] \
  && pass "--dump-dir writes one file per pass" || fail "dump files: $(ls "$TMP/dump")"
[ "$(grep -c "^// -----// IR Dump After" "$TMP/err")" = 6 ] && pass "--print-ir-after-all prints six dumps" || fail "print-ir-after-all"
for p in "pass attention: 2 " "pass precision bf16-mixed" "pass microbatch: 2 micro-batches of 4" "pass remat blocks:"; do
  grep -q "$p" "$TMP/err" && pass "-v reports '$p'" || fail "-v lacks '$p'"
done
grep -q 'memc.attention' "$TMP/dump/01-attention.mlir" && ! grep -q 'memc.attention' "$TMP/dump/00-import.mlir" \
  && pass "attention appears after the attention pass, not before" || fail "attention dump contents"
$MEMC compile models/vit_tiny.onnx --batch 8 --print-ir-after schedule -o "$TMP/s.plan" >/dev/null 2>"$TMP/err"
[ "$(grep -c '^// -----// IR Dump After schedule //----- //$' "$TMP/err")" = 1 ] && pass "--print-ir-after schedule" || fail "print-ir-after"
expect_error 2 "passes are import" -- $MEMC compile models/vit_tiny.onnx --batch 8 --print-ir-after autodiff -o "$TMP/x.plan"
# -vv: every pass's device arena before and after it (the pipeline measures what a pass does not).
$MEMC -vv compile models/vit_tiny.onnx --batch 8 --offload optimizer -o "$TMP/vv.plan" >/dev/null 2>"$TMP/err" || fail "-vv compile: $(head -c 300 "$TMP/err")"
for p in attention precision training_step offload; do
  grep -q "^memc: pass $p: device arena .* → " "$TMP/err" && pass "-vv: $p's device arena before and after" || fail "-vv lacks $p's arena"
done

# --offload optimizer: the device peak drops by the optimizer state moved to the host arena (which
# also stages the transfers), less the gradient in flight to the host (at most one parameter's
# bytes), and training is unchanged.
$MEMC compile models/vit_tiny.onnx --batch 16 --offload optimizer -o "$TMP/off.plan" --json >"$TMP/off.json" 2>"$TMP/err" || fail "offload: $(cat "$TMP/err")"
$MEMC run "$TMP/off.plan" --data data/digits_train.npz --steps 1 --quiet --dump-grads "$TMP/g_off.npz" --json "$TMP/off_run.json" >/dev/null 2>"$TMP/err" || fail "run offload: $(cat "$TMP/err")"
npz_py '
a, b = read_npz(sys.argv[1]), read_npz(sys.argv[2])
assert sorted(a) == sorted(b) and all(a[k] == b[k] for k in a), "gradients differ"
import json
one, off, run = (json.load(open(p)) for p in sys.argv[3:6])
assert off["decisions"]["offload"] == "optimizer", off["decisions"]
drop = one["predicted_peak_bytes"] - off["predicted_peak_bytes"]  # exact arithmetic: tests/planner_test.cc
assert one["breakdown"]["optimizer_state"] - one["param_bytes"] < drop <= off["host_bytes"], (one, off)
assert run["measured_peak_bytes"] == off["predicted_peak_bytes"], run
' "$TMP/g_none.npz" "$TMP/g_off.npz" "$TMP/one.json" "$TMP/off.json" "$TMP/off_run.json" \
  && pass "--offload optimizer: same gradients, device peak drops by the host arena, measured = planned" || fail "offload"

# The budget search: the plan fits, --json and --explain show the ladder and the Pareto front.
$MEMC compile models/vit_tiny.onnx --batch 16 --budget 600KB --json -o "$TMP/b.plan" >"$TMP/b.json" 2>"$TMP/err" || fail "budget search: $(cat "$TMP/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["predicted_peak_bytes"] <= 600000, d["predicted_peak_bytes"]
s = d["search"]
assert s["chosen"]["fits"] and s["chosen"]["chosen"] and s["candidates_compiled"] >= 2, s["chosen"]
assert len(s["ladder"]) >= 3 and len(s["pareto"]) >= 1, s
assert d["estimated_step_ms"] > 0 and d["target"] == "cpu", d
' "$TMP/b.json" && pass "--budget 600KB: searched plan fits, search in --json" || fail "search json: $(head -c 300 "$TMP/b.json")"
# A plan for h200 counts the CUDA kernels' scratch, not the CPU's: the largest is f32 attention's
# backward through GEMMs, cuBLASLt's 32 MiB on Hopper + two score chunks (16 images · 2 heads ·
# 17 · 17 f32 = 36,992 B, in 256-byte pieces: 37,120 B each), after the run state's 256 B (the
# step); the patch convolution's im2col and dy transposed (36,864 B) come next.
$MEMC compile models/vit_tiny.onnx --batch 16 --target h200 --json -o "$TMP/h.plan" >"$TMP/h.json" 2>"$TMP/err" || fail "h200: $(cat "$TMP/err")"
python3 -c '
import json, sys
h, c = (json.load(open(p)) for p in sys.argv[1:3])
assert h["breakdown"]["workspace"] == 256 + (32 << 20) + 2 * 37120, h["breakdown"]
assert c["breakdown"]["workspace"] < 1 << 20, c["breakdown"]
# the arena: as the CPU plan, but for the GPU rewrites (layernorm_bias_grad writes the 5 layernorm
# bias gradients, 32 f32 each, when the layernorm gradient runs, earlier than their reduce_sum;
# concat_gather_grads writes the packed q/k/v gradient as one concat, not three full-size
# gather gradients added: 64 B lower here, on every CPU)
arena = lambda p: p["predicted_peak_bytes"] - p["breakdown"]["workspace"]
assert -64 <= arena(h) - arena(c) <= 5 * 128, (arena(h), arena(c))
' "$TMP/h.json" "$TMP/one.json" && pass "--target h200 plans the CUDA kernels' workspace (cuBLASLt's 32 MiB + attention's score chunks); the arena is the CPU plan's but for its rewrites" || fail "h200 workspace"
$MEMC compile models/vit_tiny.onnx --batch 16 --budget 34.5MB --explain --target h200 -o "$TMP/e.plan" >"$TMP/e.out" 2>"$TMP/err" || fail "explain: $(cat "$TMP/err")"
grep -q "^ladder " "$TMP/e.out" && grep -q "^pareto " "$TMP/e.out" && grep -q "<- chosen" "$TMP/e.out" && grep -q "on h200" "$TMP/e.out" \
  && pass "--explain prints the ladder and the Pareto front with the chosen plan" || fail "explain output: $(cat "$TMP/e.out")"
$MEMC compile models/vit_tiny.onnx --batch 16 --budget 600KB --precision fp32 --offload none --json -o "$TMP/p.plan" >"$TMP/p.json" 2>"$TMP/err" \
  && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["decisions"]["precision"] == "fp32" and d["decisions"]["offload"] == "none", d["decisions"]' "$TMP/p.json" \
  && pass "pinned decisions stay pinned in the search" || fail "pins: $(cat "$TMP/err")"
expect_error 3 "smallest peak memc can plan" -- $MEMC compile models/vit_tiny.onnx --batch 16 --budget 50KB -o "$TMP/x.plan"
# Prefetching a streamed unit holds up to one unit in flight each way; a budget just below the
# prefetching plan is met by the same decisions scheduled without it.
S="--batch 8 --offload params --precision bf16-mixed --remat blocks"
$MEMC compile models/vit_tiny.onnx $S --json -o "$TMP/s1.plan" >"$TMP/s1.json" 2>"$TMP/err" || fail "streamed: $(cat "$TMP/err")"
P=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["predicted_peak_bytes"])' "$TMP/s1.json")
$MEMC compile models/vit_tiny.onnx $S --budget $((P - 1)) --json -o "$TMP/s2.plan" >"$TMP/s2.json" 2>"$TMP/err" \
  && python3 -c 'import json,sys; a, b = (json.load(open(p)) for p in sys.argv[1:3]); assert a["decisions"] == b["decisions"] and b["predicted_peak_bytes"] < a["predicted_peak_bytes"], (a["decisions"], b)' "$TMP/s1.json" "$TMP/s2.json" \
  && pass "a budget below the prefetching plan ($P bytes) is met without prefetching" || fail "prefetch under a budget: $(cat "$TMP/err")"
expect_error 2 "--target" -- $MEMC compile models/vit_tiny.onnx --batch 16 --target tpu -o "$TMP/x.plan"

# Lean optimizer state (u8 codes, f32 block maxima) checkpoints and resumes exactly.
$MEMC compile models/vit_tiny.onnx --batch 16 --optimizer adam8bit --epochs 2 -o "$TMP/q8.plan" >/dev/null 2>"$TMP/err" || fail "adam8bit: $(cat "$TMP/err")"
$MEMC run "$TMP/q8.plan" --data data/digits_train.npz --steps 6 --checkpoint "$TMP/q8a" --quiet >/dev/null 2>&1
$MEMC run "$TMP/q8.plan" --data data/digits_train.npz --steps 3 --checkpoint "$TMP/q8b" --quiet >/dev/null 2>&1
$MEMC run "$TMP/q8.plan" --data data/digits_train.npz --steps 3 --checkpoint "$TMP/q8b" --resume --quiet >/dev/null 2>&1
cmp -s "$TMP/q8a/checkpoint.safetensors" "$TMP/q8b/checkpoint.safetensors" \
  && pass "adam8bit: 3 + 3 resumed steps write the checkpoint of 6 straight ones, bit for bit" || fail "adam8bit resume differs"

# memc calibrate writes a profile that --target reads.
$MEMC calibrate -o "$TMP/cpu.json" --seconds 0.02 >/dev/null 2>"$TMP/err" || fail "calibrate: $(cat "$TMP/err")"
$MEMC compile models/vit_tiny.onnx --batch 16 --target "$TMP/cpu.json" --json -o "$TMP/t.plan" >"$TMP/t.json" 2>"$TMP/err" \
  && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["target"] == "cpu" and d["estimated_step_ms"] > 0, d' "$TMP/t.json" \
  && pass "memc calibrate → --target PROFILE" || fail "calibrated target: $(cat "$TMP/err")"
# The profile's gains per extra compute thread (measured at memc's threads; 0 on one core).
python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
assert all(0 <= p[k] <= 1 for k in ("heavy_thread_gain", "other_thread_gain")), p
print("GEMM %.2f, the rest %.2f" % (p["heavy_thread_gain"], p["other_thread_gain"]))' "$TMP/cpu.json" >"$TMP/out" 2>&1 \
  && pass "memc calibrate measures the gain per extra thread: $(cat "$TMP/out")" || fail "calibrate thread gains: $(cat "$TMP/out")"
# memc calibrate --device cuda measures a GPU for --target a100|h100|h200 (MEMC_GPU_PROFILE); the
# pairing is checked before any device is opened, and a profile of another device is refused.
$MEMC calibrate --device cuda -o "$TMP/g.json" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && grep -q "needs --target a100, h100 or h200" "$TMP/err" && [ ! -e "$TMP/g.json" ] \
  && pass "calibrate --device cuda without --target: exit 2, one line" || fail "calibrate --device cuda: rc $rc $(cat "$TMP/err")"
$MEMC calibrate --target h200 -o "$TMP/g.json" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && grep -q "goes with a GPU --device" "$TMP/err" && pass "calibrate --target without a GPU device: exit 2" \
  || fail "calibrate --target: rc $rc $(cat "$TMP/err")"
MEMC_GPU_PROFILE="$TMP/cpu.json" $MEMC compile models/vit_tiny.onnx --batch 16 --target h200 -o "$TMP/g.plan" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && grep -q "measured cpu, not the h200 of --target" "$TMP/err" && [ ! -e "$TMP/g.plan" ] \
  && pass "MEMC_GPU_PROFILE of another device: exit 2, one line" || fail "MEMC_GPU_PROFILE mismatch: rc $rc $(cat "$TMP/err")"
finish
