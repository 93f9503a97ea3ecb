#!/usr/bin/env bash
# §12 of bench/journal/2026.md: the budget search on the CPU, with a calibrated cost model, run and measured.
#   bench/budget_cpu.sh [MEMC]            (default /tmp/memc-bench2)
# Profile: PROFILE=FILE (a `memc calibrate` output) or, if unset, `taskset -c 1 MEMC calibrate -o $OUT/cpu.json`.
# (a) digits ViT, the scripts/demo.sh training settings:
#     MEMC compile models/vit_tiny.onnx --batch 32 --optimizer adamw --lr 2e-3 --schedule warmup-cosine
#          --warmup-steps 100 --epochs 40 --target PROFILE [--budget B] --json -o P.plan
#     unconstrained (no --budget: nothing searched, fp32) gives the planned peak P; then B = 75 %, 50 %, 25 % of P
#     (integer bytes, floor); a fraction that exits 3 is replaced by the smallest budget that compiles (bisection,
#     resolution P/1000, starting from the exit-3 message's figure). Each plan is trained fully:
#     taskset -c 1 MEMC run P.plan --data data/digits_train.npz --eval data/digits_test.npz --json R.json --quiet
# (b) torchvision ViT-B/16, a copy of the skeleton with seeded random weights ($FULL, as bench/remat_vit_b16.sh
#     writes it), batch 4, AdamW, --epochs 100 (so --steps is not capped by one epoch of the 24 samples), synthetic
#     data ($DATA: 24 images N(0,1), labels < 1000, numpy seed 0); the same fractions; per plan one --steps 1 and one
#     --steps 4 run pinned to core 1, so the mean of steps 2–4 = (4·step_ms[4] − step_ms[1]) / 3 can be given
#     beside step_ms (memc's mean over all steps, first included).
# OPENBLAS_NUM_THREADS=1 everywhere; the 1-minute load average is recorded before and after every run.
# Writes $OUT/summary.json (used by bench/recipes_vs_planner.sh and §15).   Env: OUT, PROFILE, FULL, DATA, PY, REPO.
set -uo pipefail
cd "${REPO:-$(dirname "$0")/..}"
MEMC=${1:-/tmp/memc-bench2}
PY=${PY:-/work/venv/bin/python}
out=${OUT:-$(mktemp -d)}; mkdir -p "$out"
FULL=${FULL:-/tmp/vit_b_16_random.onnx}
DATA=${DATA:-/tmp/vit_b_16_data.npz}
export OPENBLAS_NUM_THREADS=1
echo "memc: $MEMC (sha256 $(sha256sum "$MEMC" | cut -c1-16)…); work folder $out"
if [ -z "${PROFILE:-}" ]; then
  PROFILE=$out/cpu.json
  echo "calibrate: load $(cut -d' ' -f1 /proc/loadavg)"; taskset -c 1 "$MEMC" calibrate -o "$PROFILE"
fi
if [ ! -f "$FULL" ]; then
  "$PY" bench/random_weights.py models/vit_b_16_skeleton.onnx "$FULL"
fi
[ -f "$DATA" ] || "$PY" -c "
import numpy as np, sys
rng = np.random.default_rng(0)
np.savez(sys.argv[1], x=rng.standard_normal((24, 3, 224, 224), dtype=np.float32), y=rng.integers(0, 1000, 24).astype(np.int64))" "$DATA"
"$PY" - "$MEMC" "$out" "$PROFILE" "$FULL" "$DATA" <<'PYEOF'
import json, re, subprocess, sys, time
memc, out, prof, full, data = sys.argv[1:6]
load = lambda: open("/proc/loadavg").read().split()[0]

def compile_(tag, model, flags, budget=None):
    cmd = [memc, "-v", "compile", model, *flags, "--target", prof, "--json", "-o", f"{out}/{tag}.plan"]
    if budget is not None:
        cmd += ["--budget", str(budget)]
    t0 = time.perf_counter(); p = subprocess.run(cmd, capture_output=True, text=True); wall = time.perf_counter() - t0
    r = {"tag": tag, "budget": budget, "rc": p.returncode, "wall": wall, "cmd": " ".join(cmd)}
    m = re.search(r"search: (\d+) candidate plans compiled in ([\d.]+) s", p.stderr)
    r["cands"] = int(m.group(1)) if m else None
    if p.returncode == 0:
        r["json"] = json.loads(p.stdout)
    else:
        r["msg"] = p.stderr.strip().splitlines()[-1]
    return r

def budgets_for(name, model, flags, P):
    res = []
    for f in (75, 50, 25):
        B = P * f // 100
        r = compile_(f"{name}_b{f}", model, flags, B)
        r["label"] = f"{f} % = {B:,} B"
        if r["rc"] == 3:
            m = re.search(r"smallest peak memc can plan[^:]*: [\d.]+ \w+ \((\d+) bytes\)", r["msg"])
            print(f"{name} {f} % ({B:,} B): exit 3, {r['wall']:.2f} s: {r['msg']}")
            lo, hi = B, int(m.group(1))
            h = compile_(f"{name}_floor_msg", model, flags, hi)
            print(f"  compile at the message's figure {hi:,} B: rc {h['rc']}" +
                  (f", planned {h['json']['predicted_peak_bytes']:,} B, {h['json']['decisions']}" if h["rc"] == 0 else ""))
            while h["rc"] != 0:
                lo, hi = hi, hi * 2; h = compile_(f"{name}_floor_msg", model, flags, hi)
            probes = []
            while hi - lo > P // 1000:
                mid = (lo + hi) // 2
                t = compile_(f"{name}_bis", model, flags, mid)
                probes.append(f"{mid:,} rc {t['rc']} ({t['wall']:.1f} s)")
                if t["rc"] == 0: hi = mid
                else: lo = mid
            print(f"  bisection: " + ", ".join(probes))
            msg = r["msg"]
            r = compile_(f"{name}_b{f}", model, flags, hi)
            r["label"] = f"smallest feasible = {hi:,} B ({100 * hi / P:.1f} %; {f} % = {B:,} B exits 3)"
            r["infeasible_fraction"] = {"budget": B, "msg": msg}
        res.append(r)
    return res

def run(plan, args, tag):
    l0 = load()
    p = subprocess.run(["taskset", "-c", "1", memc, "run", plan, *args, "--json", f"{out}/{tag}.json", "--quiet"],
                       capture_output=True, text=True)
    l1 = load()
    if p.returncode != 0:
        print(f"run {tag}: exit {p.returncode}: {p.stderr.strip()}")
        return None
    r = json.load(open(f"{out}/{tag}.json")); r["load"] = f"{l0}→{l1}"
    return r

def dec(d):
    d = d["decisions"]
    s = f"{d['precision']}, mb {d['micro_batches']}, remat {d['remat']}, offload {d['offload']}"
    return s + ("" if d["attention"] == "tiled" else f", attention {d['attention']}")

summary = {"profile": json.load(open(prof))}
# (a) digits ViT
flags = ["--batch", "32", "--optimizer", "adamw", "--lr", "2e-3", "--schedule", "warmup-cosine", "--warmup-steps", "100", "--epochs", "40"]
u = compile_("tiny_u", "models/vit_tiny.onnx", flags); u["label"] = "unconstrained"
P = u["json"]["predicted_peak_bytes"]
rows = [u] + budgets_for("tiny", "models/vit_tiny.onnx", flags, P)
print(f"\n(a) vit_tiny batch 32, P = {P:,} B; load before runs {load()}")
for r in rows:
    r["run"] = run(f"{out}/{r['tag']}.plan", ["--data", "data/digits_train.npz", "--eval", "data/digits_test.npz"], r["tag"] + "_run")
base = rows[0]["run"]["accuracy"]
print("\n| budget | decisions | planned peak | ≤ budget | measured peak | = planned | test accuracy | Δ vs unconstrained | within 0.5 pt | step_ms measured | estimated_step_ms | measured / estimated | search: candidates, compile wall | load (1 min) |")
print("|---|---|---:|---|---:|---|---:|---:|---|---:|---:|---:|---|---|")
A = []
for r in rows:
    j, x = r["json"], r["run"]
    bud = r["budget"]
    acc = 100 * x["accuracy"]; d = 100 * (x["accuracy"] - base)
    print(f"| {r['label']} | {dec(j)} | {j['predicted_peak_bytes']:,} | {'—' if bud is None else ('yes' if j['predicted_peak_bytes'] <= bud else '**NO**')} | "
          f"{x['measured_peak_bytes']:,} | {'yes' if x['measured_peak_bytes'] == j['predicted_peak_bytes'] else '**no**'} | {acc:.2f} % | {d:+.2f} | "
          f"{'yes' if abs(d) <= 0.5 else '**no**'} | {x['step_ms']:.2f} | {j['estimated_step_ms']:.2f} | {x['step_ms'] / j['estimated_step_ms']:.2f} | "
          f"{r['cands'] or '—'}, {r['wall']:.2f} s | {x['load']} |")
    A.append({"model": "vit_tiny", "label": r["label"], "budget": bud, "decisions": j["decisions"], "planned": j["predicted_peak_bytes"],
              "measured": x["measured_peak_bytes"], "accuracy": x["accuracy"], "step_ms": x["step_ms"], "est_ms": j["estimated_step_ms"],
              "steps": x["steps"], "host_bytes": j["host_bytes"], "load": x["load"]})
summary["vit_tiny"] = {"P": P, "rows": A}

# (b) ViT-B/16
flags = ["--batch", "4", "--optimizer", "adamw", "--epochs", "100"]
u = compile_("b16_u", full, flags); u["label"] = "unconstrained"
P = u["json"]["predicted_peak_bytes"]
rows = [u] + budgets_for("b16", full, flags, P)
print(f"\n(b) vit_b_16 batch 4, P = {P:,} B; load before runs {load()}")
for r in rows:
    r["run1"] = run(f"{out}/{r['tag']}.plan", ["--data", data, "--steps", "1"], r["tag"] + "_s1")
    r["run4"] = run(f"{out}/{r['tag']}.plan", ["--data", data, "--steps", "4"], r["tag"] + "_s4")
print("\n| budget | decisions | planned peak | ≤ budget | measured peak | = planned | host_bytes | step 1 ms | step_ms (4 steps, memc) | mean of steps 2–4 | estimated_step_ms | step_ms / est | steps 2–4 / est | loss after 4 | search: candidates, compile wall | load (1 min), 1-step / 4-step run |")
print("|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
B16 = []
for r in rows:
    j, a, b = r["json"], r["run1"], r["run4"]
    bud = r["budget"]
    rest = (4 * b["step_ms"] - a["step_ms"]) / 3
    peaks = {a["measured_peak_bytes"], b["measured_peak_bytes"]}
    print(f"| {r['label']} | {dec(j)} | {j['predicted_peak_bytes']:,} | {'—' if bud is None else ('yes' if j['predicted_peak_bytes'] <= bud else '**NO**')} | "
          f"{', '.join(f'{p:,}' for p in sorted(peaks))} | {'yes' if peaks == {j['predicted_peak_bytes']} else '**no**'} | {j['host_bytes']:,} | "
          f"{a['step_ms']:.0f} | {b['step_ms']:.0f} | {rest:.0f} | {j['estimated_step_ms']:.0f} | {b['step_ms'] / j['estimated_step_ms']:.2f} | "
          f"{rest / j['estimated_step_ms']:.2f} | {b['loss']:.4f} | {r['cands'] or '—'}, {r['wall']:.2f} s | {a['load']}, {b['load']} |")
    B16.append({"model": "vit_b_16", "label": r["label"], "budget": bud, "decisions": j["decisions"], "planned": j["predicted_peak_bytes"],
                "measured": sorted(peaks), "step1_ms": a["step_ms"], "step_ms": b["step_ms"], "rest_ms": rest, "est_ms": j["estimated_step_ms"],
                "host_bytes": j["host_bytes"], "loss": b["loss"], "load": [a["load"], b["load"]]})
summary["vit_b_16"] = {"P": P, "rows": B16}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(f"\nload average after: {load()}; summary: {out}/summary.json")
PYEOF
