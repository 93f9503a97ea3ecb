#!/usr/bin/env python3
"""§15 of bench/journal/2026.md: the CPU cost model's estimated step time against the measured one.

    /work/venv/bin/python bench/cost_model_error.py --memc /tmp/memc-bench2 \
        --s12 /tmp/b12/run/summary.json --s13 /tmp/b13/run2/recipes.json --s14 /tmp/b14/run

Reads the measured runs of bench/budget_cpu.sh (§12: summary.json, which also holds the calibrated profile),
bench/recipes_vs_planner.sh (§13: recipes.json) and bench/offload_check.sh (§14: its work folder). §14's plans
were compiled with the default --target cpu, so they are recompiled here with the same flags and
--target PROFILE (memory and numerics do not depend on the target; only estimated_step_ms changes).
Measured figures: §12 vit_tiny = memc's step_ms over a full 1,760-step training run; §12 ViT-B/16 and §13 =
mean of steps 2..N (first step excluded); §14 = step_ms of 10 steps, first included.
Ranking: within each group (same model, batch and measurement), the share of configuration pairs that the
estimate orders the same way as the measurement (pairs measured within 2 % of each other are listed apart).
"""
import argparse, itertools, json, statistics, subprocess, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--memc", default="/tmp/memc-bench2")
ap.add_argument("--s12", required=True)
ap.add_argument("--s13", required=True)
ap.add_argument("--s14", required=True)
a = ap.parse_args()

s12 = json.load(open(a.s12))
prof = s12["profile"]
tmp = tempfile.mkdtemp()
json.dump(prof, open(f"{tmp}/cpu.json", "w"))

def dec(d):
    s = f"{d['precision']}, mb {d['micro_batches']}, remat {d['remat']}, offload {d['offload']}"
    return s + ("" if d.get("attention", "tiled") == "tiled" else f", attention {d['attention']}")

groups = {}
def add(group, label, d, est, meas):
    groups.setdefault(group, []).append({"label": label, "dec": dec(d), "est": est, "meas": meas})

for r in s12["vit_tiny"]["rows"]:
    add("§12a vit_tiny b32, full training (step_ms)", r["label"].split(" =")[0], r["decisions"], r["est_ms"], r["step_ms"])
for r in s12["vit_b_16"]["rows"]:
    add("§12b ViT-B/16 b4, steps 2–4", r["label"].split(" =")[0].split(" (")[0], r["decisions"], r["est_ms"], r["rest_ms"])
seen = set()
for r in json.load(open(a.s13)):
    key = (r["model"], json.dumps(r["decisions"], sort_keys=True))
    if key in seen:   # the same plan at two budgets (the recipe at 75 % and 50 %): keep its first measurement
        continue
    seen.add(key)
    n = "vit_tiny b32, steps 2–21 (median of 3)" if r["model"] == "vit_tiny" else "ViT-B/16 b4, steps 2–4"
    add(f"§13 {n}", f"{r['who']} @ {r['budget']:,} B", r["decisions"], r["est_ms"], statistics.median(r["measured_ms"]))
for p in ("fp32", "bf16-mixed"):
    for o in ("none", "optimizer"):
        c = json.loads(subprocess.run([a.memc, "compile", "models/vit_tiny.onnx", "--batch", "16", "--precision", p, "--micro-batches", "1",
                                       "--remat", "none", "--attention", "tiled", "--offload", o, "--lr", "2e-3", "--target", f"{tmp}/cpu.json",
                                       "--json", "-o", f"{tmp}/x.plan"], capture_output=True, text=True, check=True).stdout)
        r = json.load(open(f"{a.s14}/r-{p}-{o}.json"))
        add("§14 vit_tiny b16, 10 steps (step_ms)", f"{p}, offload {o}", c["decisions"], c["estimated_step_ms"], r["step_ms"])

print("calibrated profile:", json.dumps(prof))
print("\n| group | configuration | decisions | estimated ms | measured ms | measured / estimated |")
print("|---|---|---|---:|---:|---:|")
ratios = {}
for g, rows in groups.items():
    for r in rows:
        q = r["meas"] / r["est"]
        ratios.setdefault(g, []).append(q)
        print(f"| {g} | {r['label']} | {r['dec']} | {r['est']:.2f} | {r['meas']:.2f} | {q:.2f} |")
allq = [q for v in ratios.values() for q in v]
print(f"\nall {len(allq)} rows: measured/estimated median {statistics.median(allq):.2f}, range {min(allq):.2f}–{max(allq):.2f}")
for g, v in ratios.items():
    print(f"  {g}: median {statistics.median(v):.2f}, range {min(v):.2f}–{max(v):.2f}")
print("\nranking (pairs of configurations in a group ordered the same by estimate and by measurement):")
for g, rows in groups.items():
    agree, total, disagree, close = 0, 0, [], []
    for x, y in itertools.combinations(rows, 2):
        total += 1
        if abs(x["meas"] / y["meas"] - 1) < 0.02:
            close.append(f"{x['label']} vs {y['label']} ({x['meas']:.2f} / {y['meas']:.2f} measured, {x['est']:.2f} / {y['est']:.2f} est.)")
        if (x["est"] - y["est"]) * (x["meas"] - y["meas"]) > 0:
            agree += 1
        else:
            disagree.append(f"{x['label']} vs {y['label']}: est {x['est']:.2f} / {y['est']:.2f}, measured {x['meas']:.2f} / {y['meas']:.2f}")
    print(f"  {g}: {agree}/{total} pairs agree" + (f"; disagree: {'; '.join(disagree)}" if disagree else "") +
          (f"; measured within 2 %: {'; '.join(close)}" if close else ""))
