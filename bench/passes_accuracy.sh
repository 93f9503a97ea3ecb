#!/usr/bin/env bash
# §7 of bench/journal/2026.md: accuracy parity of memc's memory passes on the digits ViT.
# Trains models/vit_tiny.onnx with the settings of scripts/demo.sh (batch 32, adamw, lr 2e-3,
# warmup-cosine, 100 warm-up steps, 40 epochs) once per variant and prints a markdown table
# (test accuracy, Δ vs fp32, final loss, planned/measured peak, skipped steps, ms/step).
# ms/step is only indicative (one core, shared machine); this is not a timing benchmark.
#   bench/passes_accuracy.sh [MEMC] [SEED...]     (default /tmp/memc-bench, seed 0 = memc's default)
# Every run is pinned to core 1 with OPENBLAS_NUM_THREADS=1 (deterministic; note that the
# OpenBLAS thread count changes the rounding, so results differ from a 2-thread demo.sh run).
# OUT=DIR keeps the plans, reports and logs (default: a fresh mktemp -d).
set -uo pipefail
cd "$(dirname "$0")/.."
MEMC=${1:-/tmp/memc-bench}; shift || true
SEEDS=("$@"); [ ${#SEEDS[@]} -gt 0 ] || SEEDS=(0)
PY=${PY:-/work/venv/bin/python}
out=${OUT:-$(mktemp -d)}; mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1
common=(--batch 32 --schedule warmup-cosine --warmup-steps 100 --epochs 40)
variants=(
  "fp32|--lr 2e-3"
  "fp16-mixed|--lr 2e-3 --precision fp16-mixed"
  "bf16-mixed|--lr 2e-3 --precision bf16-mixed"
  "micro-batches 4|--lr 2e-3 --micro-batches 4"
  "micro-batches 3|--lr 2e-3 --micro-batches 3"
  "remat blocks|--lr 2e-3 --remat blocks"
  "remat 100KB|--lr 2e-3 --remat 100KB"
  "attention naive|--lr 2e-3 --attention naive"
  "bf16-true|--lr 2e-3 --precision bf16-true"
  "fp16-true|--lr 2e-3 --precision fp16-true"
  "fp16-true, lr 1e-2|--lr 1e-2 --precision fp16-true"
  "fp16-true, lr 3e-2|--lr 3e-2 --precision fp16-true"
  # diagnostics for fp16-true (not the demo's settings): lower AdamW lr, and optimizers without eps
  "fp16-true, lr 5e-4|--lr 5e-4 --precision fp16-true"
  "fp16-true, lr 1e-4|--lr 1e-4 --precision fp16-true"
  "fp16-true, momentum lr 0.05|--lr 0.05 --precision fp16-true --optimizer momentum"
  "fp16-true, sgd lr 0.1|--lr 0.1 --precision fp16-true --optimizer sgd"
)
ONLY=${ONLY:-}   # a regex: run only the variants whose name matches (the fp32 baseline always runs)
echo "memc: $MEMC (sha256 $(sha256sum "$MEMC" | cut -c1-16)…; the commit it was built from is recorded in the journal (bench/journal/2026.md), not here)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
i=0
for seed in "${SEEDS[@]}"; do
  for v in "${variants[@]}"; do
    name=${v%%|*}; flags=${v#*|}
    [[ -z "$ONLY" || "$name" == fp32 || "$name" =~ $ONLY ]] || continue
    [[ "$flags" == *--optimizer* ]] || flags="$flags --optimizer adamw"
    p="$out/r$i"
    # shellcheck disable=SC2086
    taskset -c 1 "$MEMC" -v compile models/vit_tiny.onnx "${common[@]}" $flags --json -o "$p.plan" \
      >"$p.compile.json" 2>"$p.compile.err"
    crc=$?
    rrc=-
    if [ $crc -eq 0 ]; then
      taskset -c 1 "$MEMC" run "$p.plan" --data data/digits_train.npz --eval data/digits_test.npz \
        --seed "$seed" --json "$p.json" --quiet >"$p.run.out" 2>"$p.run.err"
      rrc=$?
    fi
    printf '%s|%s|%s|%s|%s\n' "$name" "$flags" "$seed" "$crc" "$rrc" >"$p.meta"
    echo "  $name seed $seed: compile rc $crc, run rc $rrc $(tail -1 "$p.run.out" 2>/dev/null) $(head -c 300 "$p.run.err" 2>/dev/null)" >&2
    i=$((i + 1))
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$out" "$i" <<'PYEOF'
import json, os, sys, collections
out, n = sys.argv[1], int(sys.argv[2])
rows = []
for i in range(n):
    p = f"{out}/r{i}"
    name, flags, seed, crc, rrc = open(p + ".meta").read().strip().split("|")
    r = json.load(open(p + ".json")) if os.path.exists(p + ".json") else None
    err = open(p + ".run.err").read().strip() if os.path.exists(p + ".run.err") else open(p + ".compile.err").read().strip()
    c = json.load(open(p + ".compile.json")) if crc == "0" else None
    passes = [l.strip() for l in open(p + ".compile.err") if l.startswith("memc: pass ")
              and not l.startswith("memc: pass attention") and "fp32: 0 casts" not in l]
    rows.append(dict(name=name, flags=flags, seed=int(seed), crc=crc, rrc=rrc, r=r, c=c, err=err, passes=passes))
base = {row["seed"]: row["r"]["accuracy"] for row in rows if row["name"] == "fp32" and row["r"]}
seeds = sorted({row["seed"] for row in rows})
for seed in seeds:
    print(f"\nseed {seed}\n")
    print("| variant | memc compile flags (besides the demo's) | test accuracy | Δ vs fp32 (points) | within tolerance | final loss | planned peak | measured peak | skipped steps | ms/step | exit |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|")
    for row in rows:
        if row["seed"] != seed:
            continue
        r, name = row["r"], row["name"]
        tol = 1.0 if name == "bf16-true" else 0.5
        planned = f"{row['c']['predicted_peak_bytes']:,} B" if row["c"] else "—"
        if r and row["rrc"] == "0":
            acc = 100 * r["accuracy"]; d = acc - 100 * base[seed]
            within = "—" if name == "fp32" else ("yes" if abs(d) <= tol + 1e-9 else "**no**") + f" (±{tol})"
            sk = r.get("skipped_steps"); ls = r.get("loss_scale")
            sks = f"{sk}" + (f" (scale {ls:g})" if ls is not None else "")
            print(f"| {name} | `{row['flags']}` | {acc:.2f}% | {d:+.2f} | {within} | {r['loss']:.4f} | {planned} | "
                  f"{r['measured_peak_bytes']:,} B | {sks} | {r['step_ms']:.2f} | 0 |")
        else:
            print(f"| {name} | `{row['flags']}` | — | — | — | — | {planned} | — | — | — | compile {row['crc']}, run {row['rrc']}: `{row['err'][:200]}` |")
print("\npass lines (memc -v compile, seed-independent):\n")
seen = set()
for row in rows:
    if row["name"] in seen:
        continue
    seen.add(row["name"])
    for l in row["passes"]:
        print(f"- {row['name']}: `{l}`")
if len(seeds) > 1:
    print("\nmean over seeds " + ", ".join(map(str, seeds)) + "\n")
    print("| variant | accuracies | mean | Δ mean vs fp32 mean (points) |")
    print("|---|---|---:|---:|")
    by = collections.OrderedDict()
    for row in rows:
        by.setdefault(row["name"], []).append(100 * row["r"]["accuracy"] if row["r"] and row["rrc"] == "0" else None)
    bm = sum(by["fp32"]) / len(by["fp32"])
    for name, accs in by.items():
        if any(a is None for a in accs):
            print(f"| {name} | {' / '.join('—' if a is None else f'{a:.2f}' for a in accs)} | — | — |")
            continue
        m = sum(accs) / len(accs)
        print(f"| {name} | {' / '.join(f'{a:.2f}' for a in accs)} | {m:.2f}% | {m - bm:+.2f} |")
PYEOF
