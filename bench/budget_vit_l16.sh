#!/usr/bin/env bash
# §11 of bench/journal/2026.md: the budget search on torchvision ViT-L/16 (skeleton), batch 16, AdamW
# (the default optimizer), step-time estimates for --target h200. Compile only, pinned to core 1.
#   bench/budget_vit_l16.sh [MEMC]            (default /tmp/memc-bench2)
# For each budget B in 32 24 16 12 8 6 4 3 2 GB:
#   taskset -c 1 MEMC -v compile models/vit_l_16_skeleton.onnx --batch 16 --target h200 --budget B --json -o P.plan
# timed (wall clock of the process), then the plan file's own "decisions" and "optimizer.kind" are read
# to confirm the optimizer is still adamw and no -true precision was chosen.
# Then the floor: compile at 1GB (exit 3 expected), take the byte figure the one-line message names as
# "the smallest peak memc can plan", and compile at exactly that figure; then bisect (budget in bytes,
# 1 MB resolution) for the smallest budget that actually compiles, starting from [1 GB, 2 GB].
# Last, `--explain` at 6GB, and the floor message's own setting compiled with pinned flags.
# Env: OUT=DIR (default mktemp -d), PY.
set -uo pipefail
cd "$(dirname "$0")/.."
MEMC=${1:-/tmp/memc-bench2}
PY=${PY:-/work/venv/bin/python}
out=${OUT:-$(mktemp -d)}; mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1
echo "memc: $MEMC (sha256 $(sha256sum "$MEMC" | cut -c1-16)…); work folder $out"
"$PY" - "$MEMC" "$out" <<'PYEOF'
import json, re, subprocess, sys, time
memc, out = sys.argv[1], sys.argv[2]
model = "models/vit_l_16_skeleton.onnx"
def load():
    return open("/proc/loadavg").read().split()[0]

def compile_at(tag, budget, extra=()):
    cmd = ["taskset", "-c", "1", memc, "-v", "compile", model, "--batch", "16", "--target", "h200",
           "--json", "-o", f"{out}/{tag}.plan", *extra]
    if budget is not None:
        cmd += ["--budget", str(budget)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r = {"tag": tag, "budget": budget, "rc": p.returncode, "wall": wall, "err": p.stderr, "cmd": " ".join(cmd)}
    m = re.search(r"search: (\d+) candidate plans compiled in ([\d.]+) s; chosen: (.*)", p.stderr)
    r["cands"], r["search_s"] = (int(m.group(1)), float(m.group(2))) if m else (None, None)
    if p.returncode == 0:
        r["json"] = json.loads(p.stdout)
        r["plan"] = json.load(open(f"{out}/{tag}.plan"))
    else:
        r["msg"] = [l for l in p.stderr.splitlines() if "budget" in l or "error" in l.lower()][-1:]
    return r

def gb(x):
    return f"{x / 1e9:.3f}"

print(f"load average (1 min) before: {load()}")
rows = []
for g in (32, 24, 16, 12, 8, 6, 4, 3, 2):
    rows.append(compile_at(f"b{g}GB", f"{g}GB"))
# the floor, from the exit-3 message
f1 = compile_at("floor_probe", "1GB")
floor_msg = f1["msg"][0] if f1.get("msg") else f1["err"]
m = re.search(r"smallest peak memc can plan[^:]*: [\d.]+ \w+ \((\d+) bytes\)", floor_msg)
floor = int(m.group(1)) if m else None
if floor:
    rows.append(compile_at("floor_msg", floor))
# bisection for the smallest budget that compiles
lo, hi = 1_000_000_000, 2_000_000_000  # lo: exit 3 (above), hi: fits (checked below)
probes = []
ok_hi = compile_at("bis_hi", hi)
probes.append((hi, ok_hi["rc"], ok_hi["wall"]))
while hi - lo > 1_000_000 and ok_hi["rc"] == 0:
    mid = (lo + hi) // 2
    r = compile_at("bis", mid)
    probes.append((mid, r["rc"], r["wall"]))
    if r["rc"] == 0:
        hi = mid
    else:
        lo = mid
smallest = compile_at("smallest", hi)
rows.append(smallest)
# just below it
below = compile_at("below", hi - 1_000_000)
print(f"load average (1 min) after the timed compiles: {load()}\n")

print("| budget | rc | chosen decisions | planned peak | ≤ budget | estimated step ms (h200) | compile wall (s) | search (s, -v) | candidates | optimizer (plan) | precision (plan) |")
print("|---|---:|---|---:|---|---:|---:|---:|---:|---|---|")
for r in rows:
    b = r["budget"]
    bl = b if isinstance(b, str) else f"{b:,} B"
    if r["rc"] != 0:
        print(f"| {bl} | {r['rc']} | {r['msg'][0] if r.get('msg') else ''} | | | | {r['wall']:.2f} | | | | |"); continue
    d, pl = r["json"], r["plan"]
    dec = pl["decisions"]
    ds = f"{dec['precision']}, mb {dec['micro_batches']}, remat {dec['remat']}, offload {dec['offload']}, attention {dec['attention']}"
    bb = d["budget_bytes"]
    print(f"| {bl} | 0 | {ds} | {d['predicted_peak_bytes']:,} B ({gb(d['predicted_peak_bytes'])} GB) | "
          f"{'yes' if d['predicted_peak_bytes'] <= bb else '**NO**'} | {d['estimated_step_ms']:.1f} | {r['wall']:.2f}{'' if r['wall'] < 10 else ' **≥ 10 s**'} | "
          f"{r['search_s']:.2f} | {r['cands']} | {pl['optimizer']['kind']} | {dec['precision']}{' **-true**' if 'true' in dec['precision'] else ''} |")

print("\nsearch's own figure for the chosen candidate vs the written plan's peak, host bytes:\n")
print("| budget | search chosen planned_peak_bytes | plan predicted_peak_bytes | plan − search | host_bytes |")
print("|---|---:|---:|---:|---:|")
for r in rows:
    if r["rc"] == 0:
        s, d = r["json"]["search"]["chosen"]["planned_peak_bytes"], r["json"]["predicted_peak_bytes"]
        b = r["budget"]
        print(f"| {b if isinstance(b, str) else f'{b:,} B'} | {s:,} | {d:,} | {d - s:+,} | {r['json']['host_bytes']:,} |")

print(f"\nexit-3 message at 1GB (rc {f1['rc']}, {f1['wall']:.2f} s):\n  {floor_msg}")
print(f"\nbisection (budget bytes, rc, wall s): " + ", ".join(f"{b:,} rc {c} {w:.1f}s" for b, c, w in probes))
print(f"smallest budget that compiles (1 MB resolution): {hi:,} B; {hi - 1_000_000:,} B gives rc {below['rc']}: "
      f"{below['msg'][0] if below.get('msg') else ''}")
json.dump([{k: v for k, v in r.items() if k not in ('plan',)} for r in rows + [f1, below]], open(f"{out}/rows.json", "w"), default=str)
PYEOF

echo; echo "--- --explain at 6GB:"
taskset -c 1 "$MEMC" compile models/vit_l_16_skeleton.onnx --batch 16 --target h200 --budget 6GB --explain -o "$out/explain6.plan"
echo "rc $?"
echo; echo "--- the floor message's setting, pinned (no search):"
for f in "--precision bf16-mixed --micro-batches 16 --remat blocks --offload optimizer" \
         "--precision bf16-mixed --remat blocks --offload optimizer"; do
  # shellcheck disable=SC2086
  taskset -c 1 "$MEMC" -v compile models/vit_l_16_skeleton.onnx --batch 16 --target h200 $f --json -o "$out/pin.plan" \
    >"$out/pin.json" 2>"$out/pin.err"
  echo "$f: rc $? $("$PY" -c "import json,sys;d=json.load(open(sys.argv[1]));print(f\"peak {d['predicted_peak_bytes']:,} B, est {d['estimated_step_ms']:.1f} ms, host {d['host_bytes']:,} B\")" "$out/pin.json"); $(grep 'schedule:' "$out/pin.err")"
done
