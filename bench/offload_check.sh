#!/usr/bin/env bash
# §14 of bench/journal/2026.md: --offload optimizer on the digits ViT (models/vit_tiny.onnx), batch 16, AdamW,
# fp32 and bf16-mixed. Everything else is pinned (--micro-batches 1 --remat none --attention tiled,
# no --budget, so nothing is searched):
#   MEMC -v compile models/vit_tiny.onnx --batch 16 --precision P --micro-batches 1 --remat none \
#        --attention tiled --offload O --lr 2e-3 --json -o P-O.plan            (O = none | optimizer)
#   taskset -c 1 MEMC run P-O.plan --data data/digits_train.npz --steps 10 --checkpoint ck-P-O --json r-P-O.json --quiet
#   cmp ck-P-none/checkpoint.safetensors ck-P-optimizer/checkpoint.safetensors
# and the device-peak drop checked against the parameter count (the ONNX initializers) and the plan's
# train_ir (which params carry memc.space = "host").
#   bench/offload_check.sh [MEMC]            (default /tmp/memc-bench2)   Env: OUT=DIR, PY, REPO (default: the script's ..).
set -uo pipefail
cd "${REPO:-$(dirname "$0")/..}"
MEMC=${1:-/tmp/memc-bench2}
PY=${PY:-/work/venv/bin/python}
out=${OUT:-$(mktemp -d)}; mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1
echo "memc: $MEMC (sha256 $(sha256sum "$MEMC" | cut -c1-16)…); work folder $out"
for p in fp32 bf16-mixed; do
  for o in none optimizer; do
    "$MEMC" -v compile models/vit_tiny.onnx --batch 16 --precision $p --micro-batches 1 --remat none \
      --attention tiled --offload $o --lr 2e-3 --json -o "$out/$p-$o.plan" >"$out/$p-$o.json" 2>"$out/$p-$o.err" \
      || echo "compile $p $o: exit $? $(tail -1 "$out/$p-$o.err")"
    rm -rf "$out/ck-$p-$o"
    l0=$(cut -d' ' -f1 /proc/loadavg)
    taskset -c 1 "$MEMC" run "$out/$p-$o.plan" --data data/digits_train.npz --steps 10 --checkpoint "$out/ck-$p-$o" \
      --json "$out/r-$p-$o.json" --quiet >"$out/r-$p-$o.out" 2>&1 || echo "run $p $o: exit $?"
    echo "$p $o: load $l0 -> $(cut -d' ' -f1 /proc/loadavg); $(tr '\n' ' ' <"$out/r-$p-$o.out")"
  done
  if cmp "$out/ck-$p-none/checkpoint.safetensors" "$out/ck-$p-optimizer/checkpoint.safetensors"; then
    echo "$p: cmp: checkpoint.safetensors bit-identical ($(stat -c %s "$out/ck-$p-none/checkpoint.safetensors") B)"
  else
    echo "$p: cmp: checkpoints DIFFER"
  fi
done
"$PY" - "$out" <<'PYEOF'
import json, re, struct, sys
import numpy as np, onnx
out = sys.argv[1]
m = onnx.load("models/vit_tiny.onnx")
n = {i.name: int(np.prod(i.dims)) for i in m.graph.initializer}
P = sum(n.values())
al = lambda k: -(-4 * k // 64) * 64          # f32 bytes of one tensor, rounded to 64 B
ck = open(f"{out}/ck-fp32-none/checkpoint.safetensors", "rb").read()
hdr = json.loads(ck[8:8 + struct.unpack("<Q", ck[:8])[0]])
names = [k for k in hdr if k != "__metadata__"]
print(f"\nparameters: {P:,} in {len(n)} tensors; f32 bytes {4 * P:,} (rounded per tensor to 64 B: {sum(al(v) for v in n.values()):,})")
print(f"checkpoint tensors: {len(names)} ({sum(1 for k in names if k in n)} params + {len(names) - sum(1 for k in names if k in n)} others, e.g. "
      f"{[k for k in names if k not in n][:2]}); metadata {hdr.get('__metadata__')}\n")
print("| precision | offload | planned device peak | measured device peak | = | host_bytes | persistent (device) | breakdown params / optimizer_state | loss after 10 steps | step_ms | estimated_step_ms (cpu default) |")
print("|---|---|---:|---:|---|---:|---:|---|---:|---:|---:|")
R = {}
for p in ("fp32", "bf16-mixed"):
    for o in ("none", "optimizer"):
        c, r = json.load(open(f"{out}/{p}-{o}.json")), json.load(open(f"{out}/r-{p}-{o}.json"))
        R[p, o] = c
        b = c["breakdown"]
        print(f"| {p} | {o} | {c['predicted_peak_bytes']:,} | {r['measured_peak_bytes']:,} | {'yes' if c['predicted_peak_bytes'] == r['measured_peak_bytes'] else '**no**'} | "
              f"{c['host_bytes']:,} | {c['persistent_bytes']:,} | {b['params']:,} / {b['optimizer_state']:,} | {r['loss']:.6f} | {r['step_ms']:.2f} | {c['estimated_step_ms']:.2f} |")
for p in ("fp32", "bf16-mixed"):
    drop = R[p, "none"]["predicted_peak_bytes"] - R[p, "optimizer"]["predicted_peak_bytes"]
    hdr_ir = json.load(open(f"{out}/{p}-optimizer.plan"))["train_ir"].split("\n")[0]
    params = re.findall(r'%([\w.]+): tensor<[^>]*> \{memc.role = "param"', hdr_ir)
    host = set(re.findall(r'%([\w.]+): tensor<[^>]*> \{memc.role = "param", memc.name = "[^"]*", memc.space = "host"', hdr_ir))
    state = 2 * sum(al(n[k]) for k in params)        # AdamW: m and v, f32
    master = sum(al(n[k]) for k in host)
    stay = [k for k in params if k not in host]
    print(f"\n{p}: device drop {drop:,} B; AdamW state 2 × {sum(al(n[k]) for k in params):,} = {state:,} B; "
          f"params moved to host: {len(host)} tensors, {sum(n[k] for k in host):,} values, {master:,} B; "
          f"state + moved = {state + master:,} B; host_bytes {R[p, 'optimizer']['host_bytes']:,}; "
          f"params kept on device: {len(stay)} tensors, {sum(n[k] for k in stay):,} values ({', '.join(stay[:3])}…)" if stay else
          f"\n{p}: device drop {drop:,} B; AdamW state 2 × {sum(al(n[k]) for k in params):,} = {state:,} B; params moved to host: none; "
          f"host_bytes {R[p, 'optimizer']['host_bytes']:,}")
PYEOF
