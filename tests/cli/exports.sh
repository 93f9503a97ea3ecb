# Exports from today's releases (models/export_t215.py; issue 13): fixed shapes are refused in
# one line, the search never micro-batches them, inspect says which initializers are trained
# and what the exporter did to them, and a brief training run learns the text task.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"

# Fixed batch and sequence length: one line naming the export's value, exit 2, no flag the user never gave.
expect_error 2 "the export fixes the batch at 4" -- $MEMC compile models/bigbird_sparse_t215.onnx --batch 8 --seq 64 --budget 4GB -o "$TMP/x.plan"
expect_error 2 "the export fixes the sequence length at 64" -- $MEMC compile models/bigbird_sparse_t215.onnx --batch 4 --seq 128 -o "$TMP/x.plan"
expect_error 2 "the export fixes the batch at 4" -- $MEMC inspect models/distilbert_t215.onnx --batch 16
expect_error 2 "the export fixes the batch at 4" -- $MEMC compile models/vit_tiny_dynamo_t215.onnx --batch 32 -o "$TMP/x.plan"
[ ! -e "$TMP/x.plan" ] && pass "no plan written on refused shapes" || fail "plan written"
grep -q -- "--micro-batches" "$TMP/err" && fail "the refusal names --micro-batches" || pass "the refusal names no flag the user did not give"

# The budget search at the export's batch: it never tries more micro-batches than the batch allows.
$MEMC compile models/bigbird_sparse_t215.onnx --batch 4 --seq 64 --budget 4GB -o "$TMP/s.plan" --json >"$TMP/s.json" 2>"$TMP/err" || fail "search: $(cat "$TMP/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["decisions"]["micro_batches"] == 1, d["decisions"]
' "$TMP/s.json" && pass "--budget on a fixed-batch export: plan found, 1 micro-batch" || fail "search json"

# inspect: trainable initializers, fixed dims, findings (one line each, also warnings on compile).
$MEMC inspect models/vit_tiny_dynamo_t215_tied.onnx --json >"$TMP/i.json" 2>"$TMP/err" || fail "inspect: $(cat "$TMP/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["fixed_batch"] == 4 and d["fixed_seq"] == -1, d
assert "expand" in d["trainable_params"] and len(d["trainable_params"]) == 32, d["trainable_params"]
assert "encoder.ln.weight" in d["trainable_params"] and "encoder.layers.encoder_layer_1.ln_2.bias" in d["trainable_params"], d["trainable_params"]
f = d["param_findings"]
assert sum("also stood for" in x and "merged with it by value: memc trains each as its own parameter" in x for x in f) == 2, f
assert not any("is shared by" in x for x in f), f
assert sum("batch-expanded copy" in x and "[1x1x32]" in x for x in f) == 1, f
assert sum("folded transpose" in x for x in f) == 6, f
assert any("'"'"'val_12'"'"' [32x96] is the exporter'"'"'s folded transpose of parameter '"'"'encoder.layers.encoder_layer_0.self_attention.in_proj_weight'"'"'" in x for x in f), f
' "$TMP/i.json" && pass "inspect --json: 32 trainable (the 5 LayerNorm weights and biases the exporter merged by value untied), 1 batch-expanded (re-derived), 6 folded transposes named after their parameters" || fail "inspect json"
$MEMC inspect models/distilbert_t215.onnx --json >"$TMP/d.json" 2>"$TMP/err" || fail "inspect distilbert: $(cat "$TMP/err")"
python3 -c '
import json, sys
f = json.load(open(sys.argv[1]))["param_findings"]
named = [x for x in f if "folded transpose of parameter" in x]
assert len(named) == 12 and "inner.distilbert.transformer.layer.0.attention.q_lin.weight" in named[0], named
# the graph signature says position_ids is a buffer: the lookup is folded from the table alone
assert any("'"'"'embedding_1'"'"' [1x32x32] is a value the exporter folded from parameter '"'"'inner.distilbert.embeddings.position_embeddings.weight'"'"' alone" in x for x in f), f
' "$TMP/d.json" && pass "distilbert_t215: 12 folded transposes named, the folded position lookup reported with its one parameter" || fail "distilbert findings"
$MEMC compile models/vit_tiny_dynamo_t215_tied.onnx --batch 4 -o "$TMP/t.plan" >/dev/null 2>"$TMP/err" || fail "compile tied: $(cat "$TMP/err")"
[ "$(grep -c 'warning: .*merged with it by value' "$TMP/err")" -eq 2 ] && pass "compile says once per merged initializer that it unties it" || fail "merged warnings: $(cat "$TMP/err")"
# The untied parameters train apart and are written back as initializers of their own: the
# trained model has 32 initializers to train, none merged, and the LayerNorm weights differ.
$MEMC run "$TMP/t.plan" --data data/digits_train.npz --steps 3 --quiet --checkpoint "$TMP/tck" >/dev/null 2>"$TMP/err" || fail "run tied: $(cat "$TMP/err")"
$MEMC export "$TMP/t.plan" --weights "$TMP/tck" -o "$TMP/t_trained.onnx" >/dev/null 2>"$TMP/err" || fail "export tied: $(cat "$TMP/err")"
$MEMC inspect "$TMP/t_trained.onnx" --json >"$TMP/tt.json" 2>"$TMP/err" || fail "inspect exported tied: $(cat "$TMP/err")"
$MEMC compile "$TMP/t_trained.onnx" --batch 4 -o "$TMP/tt.plan" >/dev/null 2>"$TMP/err" || fail "compile exported tied: $(cat "$TMP/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["trainable_params"]) == 32 and "encoder.ln.weight" in d["trainable_params"], d["trainable_params"]
assert not any("merged with it by value" in x or "is shared by" in x for x in d["param_findings"]), d["param_findings"]
' "$TMP/tt.json" && pass "the untied LayerNorm weights and biases are exported as 10 initializers, none merged" || fail "exported untied: $(cat "$TMP/tt.json" | head -c 600)"
# --freeze names one untied parameter (encoder.ln.weight) or the merged initializer's own
# (encoder_layer_0.ln_1.bias): those two stay constants, the other 30 train and are exported.
$MEMC compile models/vit_tiny_dynamo_t215_tied.onnx --batch 4 --freeze encoder.ln.weight,encoder.layers.encoder_layer_0.ln_1.bias \
  -o "$TMP/fz.plan" >/dev/null 2>"$TMP/err" || fail "compile frozen untied: $(cat "$TMP/err")"
$MEMC run "$TMP/fz.plan" --data data/digits_train.npz --steps 2 --quiet --checkpoint "$TMP/fzck" >/dev/null 2>"$TMP/err" || fail "run frozen untied: $(cat "$TMP/err")"
python3 -c '
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; names = set(json.loads(f.read(n))) - {"__metadata__"}
params = {x for x in names if "exp_avg" not in x and "." in x}
assert "encoder.ln.weight" not in names and "encoder.layers.encoder_layer_0.ln_1.bias" not in names, sorted(names)
assert "encoder.layers.encoder_layer_1.ln_2.weight" in names and "encoder.layers.encoder_layer_0.ln_2.bias" in names, sorted(names)
' "$TMP/fzck/checkpoint.safetensors" && pass "--freeze names an untied parameter and the merged initializer itself: both constant, the rest of the group trains" || fail "frozen untied checkpoint"
$MEMC export "$TMP/fz.plan" --weights "$TMP/fzck" -o "$TMP/fz.onnx" 2>"$TMP/err" | grep -q "with 30 trained weights" && pass "export writes the 30 trained weights" || fail "export frozen untied: $(cat "$TMP/err")"
$MEMC inspect models/bigbird_sparse_t215.onnx >"$TMP/i.txt" 2>"$TMP/err" || fail "inspect sparse: $(cat "$TMP/err")"
grep -q "fixed      by the export: batch 4, seq 64" "$TMP/i.txt" && grep -q "^trainable  41 initializers" "$TMP/i.txt" && [ ! -s "$TMP/err" ] \
  && pass "inspect names the fixed batch and seq and the 41 trained initializers, no warning" || fail "inspect text: $(cat "$TMP/i.txt" "$TMP/err")"

# The re-derived class token trains as one row and is written back expanded, rows still equal.
$MEMC compile models/vit_tiny_dynamo_t215.onnx --batch 4 --lr 1e-2 -o "$TMP/v.plan" >/dev/null 2>&1 || fail "compile vit t215"
$MEMC run "$TMP/v.plan" --data data/digits_train.npz --steps 3 --quiet --checkpoint "$TMP/ck" >/dev/null 2>"$TMP/err" || fail "run vit t215: $(cat "$TMP/err")"
$MEMC export "$TMP/v.plan" --weights "$TMP/ck" -o "$TMP/v_trained.onnx" >/dev/null 2>"$TMP/err" || fail "export vit t215: $(cat "$TMP/err")"
$MEMC inspect "$TMP/v_trained.onnx" --json >"$TMP/v.json" 2>"$TMP/err" || fail "inspect exported: $(cat "$TMP/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert any("initializer '"'"'expand'"'"' [4x1x32] is a batch-expanded copy" in x for x in d["param_findings"]), d["param_findings"]
' "$TMP/v.json" && pass "trained class token exported as [4,1,32] with equal rows" || fail "exported class token"

# A tied embedding whose transpose the exporter folded (GPT-2's lm_head): trained as one tensor
# and written back under both names, the copy transposed, so the import's audit ties them again
# (it compares the values; a stale copy would train apart as 'val_248' in its own layout).
$MEMC compile models/gpt2_lm_t215.onnx --batch 4 --seq 32 --lr 1e-2 -o "$TMP/g.plan" >/dev/null 2>&1 || fail "compile gpt2 lm"
$MEMC run "$TMP/g.plan" --data data/lm_test.npz --steps 3 --quiet --checkpoint "$TMP/gck" >/dev/null 2>"$TMP/err" || fail "run gpt2 lm: $(cat "$TMP/err")"
$MEMC export "$TMP/g.plan" --weights "$TMP/gck" -o "$TMP/g_trained.onnx" >/dev/null 2>"$TMP/err" || fail "export gpt2 lm: $(cat "$TMP/err")"
$MEMC inspect "$TMP/g_trained.onnx" --json >"$TMP/g.json" 2>"$TMP/err" || fail "inspect exported lm: $(cat "$TMP/err")"
python3 -c '
import json, sys
f = json.load(open(sys.argv[1]))["param_findings"]
assert any("'"'"'val_248'"'"' [32x64] is the exporter'"'"'s folded transpose of parameter '"'"'inner.lm_head.weight'"'"', which the graph also reads (tied weights)" in x for x in f), f
' "$TMP/g.json" && pass "trained tied embedding exported with its folded transpose equal to it, transposed" || fail "exported tied transpose"

# infer at another batch than the export's: one line.
npz_py '
d = read_npz(sys.argv[1])
write_npz(sys.argv[2], {k: (d[k][0], (3,) + d[k][1][1:], d[k][2][:3 * len(d[k][2]) // d[k][1][0]]) for k in ("input_ids", "attention_mask")})
' models/distilbert_t215.ref.npz "$TMP/b3.npz" || fail "b3 npz"
expect_error 2 "the export fixes the batch at 4" -- $MEMC infer models/distilbert_t215.onnx --input "$TMP/b3.npz" -o "$TMP/o.npz"

# A brief training run on the text task learns it (full runs: README's accuracy table).
$MEMC compile models/distilbert_t215.onnx --batch 4 --seq 32 --lr 3e-3 --schedule warmup-cosine --warmup-steps 100 --epochs 2 -o "$TMP/d.plan" >/dev/null 2>&1 || fail "compile distilbert"
$MEMC run "$TMP/d.plan" --data data/text_train.npz --eval data/text_test.npz --quiet --json "$TMP/d_run.json" >/dev/null 2>"$TMP/err" || fail "run distilbert: $(cat "$TMP/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["accuracy"] >= 0.85, d["accuracy"]
print("  distilbert_t215 after 2 epochs at batch 4:", d["accuracy"])
' "$TMP/d_run.json" && pass "distilbert_t215: two epochs reach ≥ 85% on the text task (chance 55%)" || fail "distilbert accuracy $(cat "$TMP/d_run.json" | head -c 300)"
finish
