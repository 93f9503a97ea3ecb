#!/usr/bin/env bash
# §8 of bench/journal/2026.md: rematerialization on torchvision ViT-B/16 at batch 8 (AdamW, fp32, CPU).
#   bench/remat_vit_b16.sh [MEMC]            (default /tmp/memc-bench)
# (a) Pareto curve, planned: memc -v compile models/vit_b_16_skeleton.onnx --batch 8 --remat X for
#     X = none, blocks and limits from 1 GB down by ×0.7 (plus a few points near 3× less
#     activation memory); planned activation bytes at the peak, planned peak, recomputed FLOP
#     (the -v "pass remat" line) and their share of the forward FLOP (memc inspect --batch 8),
#     and which ops are recomputed (the plan's train_ir: nodes whose source ends "(recomputed)").
# (b) Measured: none, blocks and the limit nearest 3× less activation memory than none: one
#     `memc run --steps 1` and one `--steps 4` per setting, REPS times, alternating settings,
#     pinned to core 1 with OPENBLAS_NUM_THREADS=1. memc's JSON step_ms is the mean over all steps
#     of the run (first step included) and there is no per-step list, so the mean of steps 2–4
#     is (4·step_ms(4 steps) − step_ms(1 step)) / 3.
#     memc run refuses a skeleton ("initializer 'class_token': has dims but no data (skeleton
#     model)"), so the runs use a copy with seeded random weights written to /tmp ($FULL: the
#     skeleton's graph, every initializer N(0, 0.02²), LayerNorm weights 1; ~346 MB) and random
#     data ($DATA: 24 images N(0,1) f32 3×224×224, labels uniform < 1000, numpy seed 0).
# (c) perf profile of none vs the 3× limit (PERF=0 skips it).
# Env: OUT=DIR (default mktemp -d), FULL, DATA, REPS (default 3; 0 skips the timing runs),
#      SKIP_RUN=1 (planned only), PERF=0.
set -uo pipefail
cd "$(dirname "$0")/.."
MEMC=${1:-/tmp/memc-bench}
PY=${PY:-/work/venv/bin/python}
out=${OUT:-$(mktemp -d)}; mkdir -p "$out"
FULL=${FULL:-/tmp/vit_b_16_random.onnx}
DATA=${DATA:-/tmp/vit_b_16_data.npz}
REPS=${REPS:-3}
SKEL=models/vit_b_16_skeleton.onnx
export OPENBLAS_NUM_THREADS=1
echo "memc: $MEMC (sha256 $(sha256sum "$MEMC" | cut -c1-16)…)"
"$MEMC" inspect "$SKEL" --batch 8 --json >"$out/inspect.json"

# (a) planned sweep
limits="none blocks 1GB 700MB 490MB 343MB 320MB 300MB 280MB 240MB 168MB 118MB 82MB 58MB 40MB 28MB 20MB 14MB 10MB 1MB"
for r in $limits; do
  "$MEMC" -v compile "$SKEL" --batch 8 --optimizer adamw --remat "$r" --json -o "$out/s_$r.plan" \
    >"$out/s_$r.json" 2>"$out/s_$r.err" || echo "compile --remat $r: exit $? $(grep -v '^memc: \(fusion\|pass\|schedule\)' "$out/s_$r.err")"
done
"$PY" - "$out" "$limits" <<'PYEOF'
import json, math, re, sys, collections
out, limits = sys.argv[1], sys.argv[2].split()
fwd = json.load(open(f"{out}/inspect.json"))["forward_flops"]
base = json.load(open(f"{out}/s_none.json"))["breakdown"]["activations"]
print(f"forward FLOP at batch 8: {fwd:,}\n")
print("| --remat | planned activations at peak | ÷ none | planned peak | tapes held at once (-v) | nodes recomputed | recomputed FLOP | % of forward FLOP |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
best, best_d = None, 1e9
for r in limits:
    try:
        d = json.load(open(f"{out}/s_{r}.json"))
    except Exception:
        print(f"| {r} | compile failed | | | | | | |"); continue
    act, peak = d["breakdown"]["activations"], d["predicted_peak_bytes"]
    line = next((l for l in open(f"{out}/s_{r}.err") if "pass remat" in l), "")
    m = re.search(r"tapes held at once ([\d.]+ \w+); (\d+) nodes recomputed \((\d+) FLOP\)", line)
    held, nodes, flop = (m.group(1), int(m.group(2)), int(m.group(3))) if m else ("—", 0, 0)
    print(f"| {r} | {act:,} B ({act / 1e6:.1f} MB) | {base / act:.2f}× | {peak:,} B ({peak / 1e9:.3f} GB) | {held} | {nodes} | {flop:,} | {100 * flop / fwd:.1f} % |")
    if r not in ("none", "blocks") and abs(base / act - 3) < best_d:
        best, best_d = r, abs(base / act - 3)
open(f"{out}/r3", "w").write(best)
print(f"\nlimit nearest 3× less activation memory than none: {best}\n")

def dims(t):
    return [int(x) for x in t.split("x")[:-1]]
print("recomputed nodes by op (count, and FLOP for the matmul-like ops, from the shapes in train_ir):\n")
print("| --remat | recomputed ops (count) | recomputed FLOP: linear | attention | total counted | -v total |")
print("|---|---|---:|---:|---:|---:|")
for r in ("blocks", best):
    ir = json.load(open(f"{out}/s_{r}.plan"))["train_ir"].split("\n")
    cnt, fl = collections.Counter(), collections.Counter()
    for l in ir:
        if "(recomputed)" not in l:
            continue
        op = re.search(r'"memc\.(\w+)"', l).group(1)
        cnt[op] += 1
        sig = l.rsplit(" : ", 1)[1]
        ins, outs = (re.findall(r"tensor<([^>]*)>", x) for x in sig.split("->"))
        if op == "linear":
            fl[op] += 2 * math.prod(dims(outs[0])) * dims(ins[0])[-1]
        elif op == "attention":
            q, k = dims(ins[0]), dims(ins[1])
            fl[op] += 4 * q[0] * q[1] * q[2] * k[2] * q[3]
    line = next((l for l in open(f"{out}/s_{r}.err") if "pass remat" in l), "")
    vt = int(re.search(r"\((\d+) FLOP\)", line).group(1))
    print(f"| {r} | {', '.join(f'{k} {v}' for k, v in cnt.most_common())} | {fl['linear']:,} | {fl['attention']:,} | {sum(fl.values()):,} | {vt:,} |")

# which linears the solver recomputes, per encoder layer (weight shape: 2304x768 = qkv in_proj,
# 768x768 = out_proj, 3072x768 = mlp fc1, 768x3072 = mlp fc2)
names = {"2304x768": "qkv", "768x768": "out_proj", "3072x768": "fc1", "768x3072": "fc2"}
per_layer = collections.defaultdict(list)
for l in json.load(open(f"{out}/s_{best}.plan"))["train_ir"].split("\n"):
    if "(recomputed)" in l and '"memc.linear"' in l:
        src = re.search(r'memc.source = "([^"]*)"', l).group(1)
        m = re.search(r"encoder_layer_(\d+)/", src)
        w = re.findall(r"tensor<([^>]*)>", l.rsplit(" : ", 1)[1])[1].rsplit("x", 1)[0]
        per_layer[int(m.group(1)) if m else -1].append(names.get(w, w))
print(f"\n--remat {best}: recomputed linears per encoder layer: " +
      "; ".join(f"{k}: {'+'.join(v)}" for k, v in sorted(per_layer.items())))

# what --remat none keeps from forward for backward (forward values read by a gradient node),
# by producing op: the budget the solver has to cut
BW = {"f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i1": 1, "u8": 1, "f64": 8}
def tbytes(t):
    parts = t.split("x")
    return math.prod(int(p) for p in parts[:-1]) * BW.get(parts[-1], 4)
defs, used_by_bwd = {}, set()
for l in json.load(open(f"{out}/s_none.plan"))["train_ir"].split("\n"):
    m = re.match(r'\s*(%[^=]+?) = "memc\.(\w+)"\((.*?)\)', l)
    if not m:
        continue
    src = re.search(r'memc.source = "([^"]*)"', l)
    fwd = not (src and src.group(1).startswith("grad"))
    outs = [o.strip() for o in m.group(1).split(",")]
    for o, t in zip(outs, re.findall(r"tensor<([^>]*)>", l.rsplit(" : ", 1)[1].split("->")[1])):
        defs[o] = (m.group(2), tbytes(t), fwd)
    if not fwd:
        used_by_bwd |= {x.strip() for x in m.group(3).split(",") if x.strip()}
saved, n = collections.Counter(), collections.Counter()
for v, (op, b, fwd) in defs.items():
    if fwd and v in used_by_bwd:
        saved[op] += b; n[op] += 1
tot = sum(saved.values())
print(f"\n--remat none keeps {tot / 1e6:.1f} MB of forward values for backward; by producing op: " +
      ", ".join(f"{op} {n[op]} values {b / 1e6:.1f} MB ({100 * b / tot:.0f} %)" for op, b in saved.most_common() if b > 1e5))
PYEOF
[ "${SKIP_RUN:-0}" = 1 ] && exit 0

# (b) measured
R3=$(cat "$out/r3")
if [ ! -f "$FULL" ]; then
  "$PY" bench/random_weights.py "$SKEL" "$FULL"
fi
[ -f "$DATA" ] || "$PY" -c "
import numpy as np, sys
rng = np.random.default_rng(0)
np.savez(sys.argv[1], x=rng.standard_normal((24, 3, 224, 224), dtype=np.float32), y=rng.integers(0, 1000, 24).astype(np.int64))" "$DATA"
for r in none blocks "$R3"; do
  # --epochs: with 24 samples one epoch is 3 steps and memc run caps --steps at the plan's epochs
  "$MEMC" compile "$FULL" --batch 8 --optimizer adamw --remat "$r" --epochs 100 --json -o "$out/m_$r.plan" >"$out/m_$r.json"
done
for rep in $(seq 1 "$REPS"); do
  for r in none blocks "$R3"; do
    for n in 1 4; do
      f="$out/run_${r}_${n}_$rep"
      l0=$(cut -d' ' -f1 /proc/loadavg)
      taskset -c 1 "$MEMC" run "$out/m_$r.plan" --data "$DATA" --steps $n --json "$f.json" --quiet >"$f.out" 2>"$f.err"
      rc=$?
      l1=$(cut -d' ' -f1 /proc/loadavg)
      echo "$l0 $l1 $rc" >"$f.load"
      echo "remat $r steps $n rep $rep: rc $rc, load $l0 -> $l1, $(tr '\n' ' ' <"$f.out")$(cat "$f.err")" >&2
    done
  done
done
[ "$REPS" -gt 0 ] && "$PY" - "$out" "$R3" "$REPS" <<'PYEOF'
import json, sys, statistics
out, r3, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
print("\nmeasured (memc run, batch 8, one core):\n")
print("| --remat | planned peak (skeleton) | planned peak (weighted copy) | measured peak | = planned | activations at peak | step 1 (ms) | mean of steps 2–4 (ms), per rep | mean of steps 2–4 vs none | load avg (1 min) before → after, per run |")
print("|---|---:|---:|---:|---|---:|---:|---:|---:|---|")
res = {}
for r in ("none", "blocks", r3):
    sk = json.load(open(f"{out}/s_{r}.json"))
    firsts, rest, loads, peaks = [], [], [], set()
    for rep in range(1, reps + 1):
        a = json.load(open(f"{out}/run_{r}_1_{rep}.json")); b = json.load(open(f"{out}/run_{r}_4_{rep}.json"))
        assert (a.get("steps_this_run", a["steps"]), b.get("steps_this_run", b["steps"])) == (1, 4), (r, rep)
        firsts.append(a["step_ms"]); rest.append((4 * b["step_ms"] - a["step_ms"]) / 3)
        peaks |= {a["measured_peak_bytes"], b["measured_peak_bytes"]}
        for n in (1, 4):
            l0, l1, _ = open(f"{out}/run_{r}_{n}_{rep}.load").read().split()
            loads.append(f"{l0}→{l1}")
    res[r] = (sk, b, firsts, rest, peaks, loads)
base = statistics.mean(res["none"][3])
for r, (sk, b, firsts, rest, peaks, loads) in res.items():
    pk = sorted(peaks)
    print(f"| {r} | {sk['predicted_peak_bytes']:,} B | {b['predicted_peak_bytes']:,} B | {', '.join(f'{p:,}' for p in pk)} B | "
          f"{'yes' if pk == [b['predicted_peak_bytes']] else '**no**'} | {sk['breakdown']['activations'] / 1e6:.1f} MB | "
          f"{' / '.join(f'{x:.0f}' for x in firsts)} | {' / '.join(f'{x:.0f}' for x in rest)} | "
          f"{100 * (statistics.mean(rest) / base - 1):+.1f} % | {', '.join(loads)} |")
PYEOF

# (c) where the extra time goes: perf (cpu-clock; user and kernel symbols, start-up included) on --steps 3 of none and
# the 3× limit, samples per symbol and their difference (PERF=0 skips it)
if [ "${PERF:-1}" = 1 ] && command -v perf >/dev/null; then
  for r in none "$R3"; do
    echo "perf $r: load average before $(cut -d' ' -f1 /proc/loadavg)" >&2
    perf record -q -e cpu-clock -F 499 -o "$out/perf_$r.data" -- taskset -c 1 "$MEMC" run "$out/m_$r.plan" \
      --data "$DATA" --steps 3 --json "$out/perf_$r.json" --quiet >/dev/null 2>&1
    echo "perf $r: load average after $(cut -d' ' -f1 /proc/loadavg)" >&2
    perf report -i "$out/perf_$r.data" --stdio -F sample,sym 2>/dev/null >"$out/perf_$r.txt"
  done
  "$PY" - "$out" "$R3" <<'PYEOF'
import re, sys
out, r3 = sys.argv[1], sys.argv[2]
def load(r):
    d = {}
    for l in open(f"{out}/perf_{r}.txt"):
        m = re.match(r"\s*(\d+)\s+\[.\]\s+(.*)", l)
        if m:
            d[m.group(2).strip()] = d.get(m.group(2).strip(), 0) + int(m.group(1))
    return sum(d.values()), d
ta, a = load("none"); tb, b = load(r3)
print(f"\nperf, memc run --steps 3 (incl. start-up and weight loading), 499 Hz: none {ta} samples, {r3} {tb} samples\n")
print(f"| symbol | none | {r3} | difference | ≈ ms per step |")
print("|---|---:|---:|---:|---:|")
for k in sorted(set(a) | set(b), key=lambda k: -(b.get(k, 0) - a.get(k, 0)))[:14]:
    d = b.get(k, 0) - a.get(k, 0)
    print(f"| `{k[:70]}` | {a.get(k, 0):.0f} | {b.get(k, 0):.0f} | {d:+.0f} | {d / 3 / 499 * 1000:+.0f} |")
PYEOF
fi