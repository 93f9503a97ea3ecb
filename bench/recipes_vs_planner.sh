#!/usr/bin/env bash
# §13 of bench/journal/2026.md: the budget planner vs the articles' fixed recipe, measured on the CPU.
#   bench/recipes_vs_planner.sh [MEMC]            (default /tmp/memc-bench2)
# Models and budgets as in bench/budget_cpu.sh (§12): vit_tiny batch 32 (the demo's training flags) and the
# random-weight ViT-B/16 copy at batch 4; budgets 75 %, 50 %, 25 % of the unconstrained planned peak P, a fraction
# that exits 3 replaced by the smallest budget that compiles (bisection, resolution P/1000). SUMMARY=FILE reuses
# the budgets of a bench/budget_cpu.sh summary.json instead of recomputing them.
# Hand recipe: the articles' order, each step keeping the previous ones, every decision pinned so nothing is searched:
#   fp32 → bf16-mixed → bf16-mixed + --micro-batches 2, 4, 8, … (up to the batch) → + --remat blocks → + --offload optimizer
#   MEMC compile M FLAGS --budget B --target PROFILE --precision P --micro-batches K --remat R --offload O --attention tiled
# and the first that compiles (exit 0, not 3) is the recipe's plan. The planner's plan: the same with only --budget B.
# Measured: pinned to core 1, OPENBLAS_NUM_THREADS=1; per plan one run of 1 step and one of N+1 steps (vit_tiny N=20,
# ViT-B/16 N=3); the mean of steps 2..N+1 = ((N+1)·step_ms[N+1] − step_ms[1]) / N (memc's step_ms includes the first
# step). REPS_TINY (default 3) / REPS_B16 (default 1) repetitions, recipe and planner alternating (order flipped
# every rep). Env: OUT, PROFILE (required unless SUMMARY has it: a memc calibrate output), SUMMARY, FULL, DATA, PY, REPO.
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
  if [ -n "${SUMMARY:-}" ]; then
    PROFILE=$out/cpu.json; "$PY" -c "import json,sys; json.dump(json.load(open(sys.argv[1]))['profile'], open(sys.argv[2], 'w'))" "$SUMMARY" "$PROFILE"
  else
    PROFILE=$out/cpu.json; taskset -c 1 "$MEMC" calibrate -o "$PROFILE"
  fi
fi
[ -f "$FULL" ] && [ -f "$DATA" ] || { echo "need $FULL and $DATA: run bench/budget_cpu.sh (or bench/remat_vit_b16.sh) first"; exit 2; }
"$PY" - "$MEMC" "$out" "$PROFILE" "$FULL" "$DATA" "${SUMMARY:-}" "${REPS_TINY:-3}" "${REPS_B16:-1}" <<'PYEOF'
import json, re, subprocess, sys, time, statistics
memc, out, prof, full, data, summ, reps_tiny, reps_b16 = sys.argv[1:9]
load = lambda: open("/proc/loadavg").read().split()[0]

def compile_(tag, model, flags, budget=None, pins=()):
    cmd = [memc, "compile", model, *flags, "--target", prof, "--json", "-o", f"{out}/{tag}.plan", *pins]
    if budget is not None:
        cmd += ["--budget", str(budget)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    r = {"rc": p.returncode, "pins": " ".join(pins), "plan": f"{out}/{tag}.plan"}
    if p.returncode == 0: r["json"] = json.loads(p.stdout)
    else: r["msg"] = p.stderr.strip().splitlines()[-1]
    return r

def budgets(name, model, flags):
    if summ:
        s = json.load(open(summ))[name]
        return s["P"], [r["budget"] for r in s["rows"] if r["budget"] is not None]
    P = compile_(f"{name}_u", model, flags)["json"]["predicted_peak_bytes"]
    res = []
    for f in (75, 50, 25):
        B = P * f // 100
        r = compile_(f"{name}_p", model, flags, B)
        if r["rc"] == 3:
            lo, hi = B, int(re.search(r"\((\d+) bytes\) with", r["msg"]).group(1))
            while compile_(f"{name}_p", model, flags, hi)["rc"] != 0: lo, hi = hi, 2 * hi
            while hi - lo > P // 1000:
                mid = (lo + hi) // 2
                if compile_(f"{name}_p", model, flags, mid)["rc"] == 0: hi = mid
                else: lo = mid
            B = hi
        res.append(B)
    return P, res

def recipe(tag, model, flags, B, batch):
    steps = [("fp32", 1, "none", "none"), ("bf16-mixed", 1, "none", "none")]
    k = 2
    while k <= batch:
        steps.append(("bf16-mixed", k, "none", "none")); k *= 2
    kmax = steps[-1][1]
    steps += [("bf16-mixed", kmax, "blocks", "none"), ("bf16-mixed", kmax, "blocks", "optimizer")]
    tried = []
    for p, k, rm, o in steps:
        pins = ("--precision", p, "--micro-batches", str(k), "--remat", rm, "--offload", o, "--attention", "tiled")
        r = compile_(tag, model, flags, B, pins)
        tried.append(f"{p} mb{k} remat {rm} offload {o}: rc {r['rc']}")
        if r["rc"] == 0:
            r["tried"] = tried; return r
        if r["rc"] != 3:
            print(f"recipe step {pins}: exit {r['rc']}: {r['msg']}")
    return {"rc": 3, "tried": tried}

def run(plan, args, n, tag):
    p = subprocess.run(["taskset", "-c", "1", memc, "run", plan, *args, "--steps", str(n), "--json", f"{out}/{tag}.json", "--quiet"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print(f"run {tag}: exit {p.returncode}: {p.stderr.strip()}"); return None
    return json.load(open(f"{out}/{tag}.json"))

def measure(plan, args, N, tag):
    l0 = load(); a = run(plan, args, 1, tag + "_1"); b = run(plan, args, N + 1, tag + f"_{N + 1}"); l1 = load()
    return {"rest": ((N + 1) * b["step_ms"] - a["step_ms"]) / N, "first": a["step_ms"], "peak": {a["measured_peak_bytes"], b["measured_peak_bytes"]},
            "loss": b["loss"], "load": f"{l0}→{l1}"}

def dec(d):
    s = f"{d['precision']}, mb {d['micro_batches']}, remat {d['remat']}, offload {d['offload']}"
    return s + ("" if d["attention"] == "tiled" else f", attention {d['attention']}")

cases = [("vit_tiny", "models/vit_tiny.onnx", ["--batch", "32", "--optimizer", "adamw", "--lr", "2e-3", "--schedule", "warmup-cosine",
          "--warmup-steps", "100", "--epochs", "40"], 32, ["--data", "data/digits_train.npz"], 20, int(reps_tiny)),
         ("vit_b_16", full, ["--batch", "4", "--optimizer", "adamw", "--epochs", "100"], 4, ["--data", data], 3, int(reps_b16))]
allrows = []
for name, model, flags, batch, args, N, reps in cases:
    P, bs = budgets(name, model, flags)
    print(f"\n{name}: P = {P:,} B; budgets {', '.join(f'{b:,}' for b in bs)}; mean of steps 2–{N + 1} per plan, {reps} rep(s)")
    rows = []
    for i, B in enumerate(bs):
        rc = recipe(f"{name}_r{i}", model, flags, B, batch)
        pl = compile_(f"{name}_p{i}", model, flags, B)
        print(f"  budget {B:,} ({100 * B / P:.1f} % of P): recipe tried " + "; ".join(rc["tried"]))
        rows.append((B, rc, pl, {"r": [], "p": []}))
    for rep in range(reps):
        for B, rc, pl, m in rows:
            order = [("r", rc), ("p", pl)] if rep % 2 == 0 else [("p", pl), ("r", rc)]
            for k, c in order:
                if c["rc"] == 0:
                    m[k].append(measure(c["plan"], args, N, f"{name}_{k}_{B}_{rep}"))
    print(f"\n| budget | recipe decisions | recipe planned peak | recipe est. ms | recipe step ms (measured) | planner decisions | planner planned peak | planner est. ms | planner step ms (measured) | planner ≤ recipe (measured) | planner ≤ recipe (estimated) | per-rep ms recipe / planner | loads |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---|---|---|---|")
    for B, rc, pl, m in rows:
        rj, pj = rc.get("json"), pl.get("json")
        rr = statistics.median(x["rest"] for x in m["r"]) if m["r"] else None
        pr = statistics.median(x["rest"] for x in m["p"]) if m["p"] else None
        for c, k in ((rc, "r"), (pl, "p")):
            for x in m[k]:
                assert x["peak"] == {c["json"]["predicted_peak_bytes"]}, (B, k, x["peak"])
        same = rj and pj and rj["decisions"] == pj["decisions"]
        if rj is None:
            print(f"| {B:,} B ({100 * B / P:.1f} % of P) | **none fits** (every step exits 3) | | | | {dec(pj['decisions'])} | {pj['predicted_peak_bytes']:,} | "
                  f"{pj['estimated_step_ms']:.2f} | {pr:.2f} | (recipe fails) | (recipe fails) | ; {' / '.join(format(x['rest'], '.2f') for x in m['p'])} | "
                  f"{', '.join(x['load'] for x in m['p'])} |")
        else:
            print(f"| {B:,} B ({100 * B / P:.1f} % of P) | {dec(rj['decisions'])} | {rj['predicted_peak_bytes']:,} | {rj['estimated_step_ms']:.2f} | {rr:.2f} | "
                  f"{'same' if same else dec(pj['decisions'])} | {pj['predicted_peak_bytes']:,} | {pj['estimated_step_ms']:.2f} | {pr:.2f} | "
                  f"{'yes' if pr <= rr else '**no**'} ({100 * (pr / rr - 1):+.1f} %) | {'yes' if pj['estimated_step_ms'] <= rj['estimated_step_ms'] else 'no'} | "
                  f"{' / '.join(format(x['rest'], '.2f') for x in m['r'])} ; {' / '.join(format(x['rest'], '.2f') for x in m['p'])} | "
                  f"{', '.join(x['load'] for x in m['r'] + m['p'])} |")
        for k, c, mm in (("recipe", rj, m["r"]), ("planner", pj, m["p"])):
            if c is not None:
                allrows.append({"model": name, "budget": B, "who": k, "decisions": c["decisions"], "planned": c["predicted_peak_bytes"],
                                "est_ms": c["estimated_step_ms"], "measured_ms": [x["rest"] for x in mm], "first_ms": [x["first"] for x in mm],
                                "loss": [x["loss"] for x in mm]})
json.dump(allrows, open(f"{out}/recipes.json", "w"), indent=1)
print(f"\nall measured peaks = planned; load after {load()}; {out}/recipes.json")
PYEOF
