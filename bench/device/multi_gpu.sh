#!/usr/bin/env bash
# Issue 39's device check: ZeRO-1/2/3 on GPU ranks over NCCL, on the one lent card. 2 and 3
# ranks share the GPU (NCCL 2.30's NCCL_MULTI_RANK_GPU_ENABLE=1; PyTorch's wheel brings
# nvidia-nccl-cu13 2.30.7), for vit_tiny (digits) and ViT-B/16 (random weights, 8 images per
# rank), fp32 and bf16-mixed. Each row: the gradient's relative error against the one-GPU step of
# the same global batch, every rank's planned and measured peaks, the step time, the
# communicator, and the cost model's collective time beside the measured timeline's.
#
# The gradient is read from one SGD step at lr 1000 (no momentum, decay or clipping): the
# parameters move by -1000·g, so g = (p0 − p1)/1000 from the consolidated checkpoint, through the
# GPU kernels and NCCL, with float32 rounding of 1e-7 of |g|. Error per tensor: max|g − g1|/max|g1|,
# g1 the one-GPU step's; the row's is the worst tensor's (targets: 1e-5 fp32, 1e-2 bf16-mixed).
#
# Here:    scripts/device_deps.sh            (memc, the CUDA module, Open MPI into .devdeps/)
# Device:  run(command="bash bench/device/multi_gpu.sh", carry=[".devdeps"], timeout_s=420)
# Output:  $OUT/multi_gpu.txt (the log and table), $OUT/multi_gpu.json (the rows)
# Rehearsal without a GPU: DEVICE=cpu PYTHON=build/python-test-venv/bin/python bash bench/device/multi_gpu.sh
# runs every step on CPU ranks over the bundled Open MPI (the communicator is then mpi); MODELS
# picks models (default: vit_tiny vit_b16).
set -uo pipefail
device=${DEVICE:-cuda}
py=${PYTHON:-python3}
target=h200 threads=()
[[ $device == cpu ]] && target=cpu threads=(--threads 1)  # a CPU plan for CPU ranks, one thread each
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/memc-multi-gpu}
mkdir -p "$out"
exec > >(tee "$out/multi_gpu.txt") 2>&1
bundle=.devdeps/memc-device.tar.xz
[[ -f $bundle ]] || { echo "no $bundle: run scripts/device_deps.sh and carry .devdeps"; exit 2; }
root=/tmp/memc-device
rm -rf "$root" && mkdir -p "$root" && tar -xJf "$bundle" -C "$root"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
# NCCL (2.30.7) and cuDNN from PyTorch's wheels; cuBLASLt from the toolkit.
wheel_libs=$($py -c 'import glob, os, nvidia; print(":".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))' 2>/dev/null)
export LD_LIBRARY_PATH="$root/lib:${wheel_libs}:$(dirname "$(dirname "$nvcc")")/lib64:${LD_LIBRARY_PATH:-}"
source bench/device/mpi_env.sh
export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_MAX_CTAS=${NCCL_MAX_CTAS:-4}
memc=$root/bin/memc
echo "binaries of commit $(cat "$root/COMMIT"); $(date -u +%FT%TZ)"
if [[ $device == cuda ]]; then
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1) && [[ -n $gpu ]] ||
    { echo "no GPU: nothing measured"; exit 0; }
  echo "$gpu"
  case $gpu in *H100*) target=h100 ;; *A100*) target=a100 ;; esac  # the plans' target: the card lent
  $py -c 'import torch; print("torch", torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))'
fi
"$root/mpi/usr/bin/orterun" --version | head -1
work=/tmp/multi_gpu
rm -rf "$work" && mkdir -p "$work"
# NCCL's own checks first, on 2 ranks sharing the GPU: the rank-ordered layout, bf16 sums, and a
# done on the compute stream (Communicator::wait_on, then settle) ordering what follows it.
if [[ $device == cuda && -x $root/bin/comm_nccl_test ]]; then
  timeout 90 "${mpirun_local[@]}" -np 2 "$root/bin/comm_nccl_test" --gtest_color=no 2>&1 | grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|PASSED|FAILED' ||
    echo "comm_nccl_test: no result (exit ${PIPESTATUS[0]})"
fi
rows="$out/multi_gpu.jsonl"
: >"$rows"

$py - "$work" <<'EOF'
import sys, numpy as np
rng = np.random.default_rng(0)
np.savez(sys.argv[1] + "/vit224.npz", x=rng.standard_normal((24, 3, 224, 224), dtype=np.float32), y=rng.integers(0, 1000, 24))
EOF
$py bench/random_weights.py models/vit_b_16_skeleton.onnx "$work/vitb.onnx" > /dev/null

# step MODEL_NAME ONNX DATA NP GLOBAL_BATCH STAGE PRECISION: one SGD step at lr 1000 (the gradient)
# and six AdamW steps (the time and the timeline); NP 1 is the reference. Writes $work/<tag>/.
step() {
  local name=$1 onnx=$2 data=$3 np=$4 batch=$5 stage=$6 precision=$7
  local tag="${name}_np${np}_b${batch}_${stage}_${precision}" d
  d="$work/$tag"
  mkdir -p "$d"
  local shard=()
  [[ $np -gt 1 ]] && shard=(--devices "$np" --shard "$stage")
  local common=(--batch "$batch" --precision "$precision" --target "$target" "${shard[@]}")
  "$memc" compile "$onnx" "${common[@]}" --optimizer sgd --lr 1000 -o "$d/g.plan" > "$d/compile.txt" 2>&1 &&
    "$memc" compile "$onnx" "${common[@]}" --optimizer adamw --lr 1e-4 --epochs 8 -o "$d/t.plan" --json > "$d/t.compile.json" 2>> "$d/compile.txt" ||
    { echo "$tag: compile failed: $(tail -1 "$d/compile.txt")"; return 1; }
  local launch=()
  [[ $np -gt 1 ]] && launch=("${mpirun_local[@]}" -np "$np")
  # A run past its 120 s is killed (rc 124), and its ranks then say the launcher stopped them:
  # say which (a CPU rehearsal of ViT-B/16 on 3 oversubscribed ranks takes that long).
  why() { [[ $1 == 124 ]] && echo "timed out after 120 s" || tail -2 "$2" | tr '\n' ' '; }
  timeout 120 "${launch[@]}" "$memc" run "$d/g.plan" --data "$data" --steps 1 --device "$device" "${threads[@]}" --checkpoint "$d/ck" --quiet \
    --json "$d/g.json" > "$d/g.out" 2>&1 || { echo "$tag: gradient run failed: $(why $? "$d/g.out")"; return 1; }
  timeout 120 "${launch[@]}" "$memc" run "$d/t.plan" --data "$data" --steps 6 --device "$device" "${threads[@]}" --profile --quiet \
    --json "$d/t.json" > "$d/t.out" 2>&1 || { echo "$tag: timed run failed: $(why $? "$d/t.out")"; return 1; }
  echo "$tag: done"
}

for model in ${MODELS:-vit_tiny vit_b16}; do
  if [[ $model == vit_tiny ]]; then onnx=models/vit_tiny.onnx data=data/digits_train.npz per=8; else onnx=$work/vitb.onnx data=$work/vit224.npz per=8; fi
  for precision in fp32 bf16-mixed; do
    for np in 2 3; do
      step "$model" "$onnx" "$data" 1 $((per * np)) none "$precision"
      for stage in zero1 zero2 zero3; do
        step "$model" "$onnx" "$data" "$np" $((per * np)) "$stage" "$precision"
      done
    done
  done
done

$py - "$work" "$rows" models/vit_tiny.onnx "$work/vitb.onnx" <<'EOF'
import glob, json, os, struct, sys
import numpy as np, onnx
from onnx import numpy_helper
work, rows_path, tiny, vitb = sys.argv[1:5]
def initial(path):
    return {i.name: numpy_helper.to_array(i).astype(np.float32) for i in onnx.load(path).graph.initializer}
def checkpoint(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__" or v["dtype"] != "F32":
            continue
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(v["shape"])
    return out
p0 = {"vit_tiny": initial(tiny), "vit_b16": initial(vitb)}
def grads(model, d):
    p1 = checkpoint(os.path.join(d, "ck", "checkpoint.safetensors"))
    return {k: (p0[model][k] - p1[k]) / 1000.0 for k in p1 if k in p0[model]}
rows = []
for d in sorted(glob.glob(work + "/*_np*_b*_*")):
    tag = os.path.basename(d)
    model, rest = tag.split("_np")
    np_, batch, stage, precision = rest.split("_", 3)
    if stage == "none" or not os.path.exists(d + "/t.json") or not os.path.exists(d + "/ck"):
        continue
    ref = [r for r in glob.glob(f"{work}/{model}_np1_{batch}_none_{precision}") if os.path.exists(r + "/ck")]
    g = grads(model, d)
    err = None
    for r in ref:  # the one-GPU step of the same global batch and precision
        g1 = grads(model, r)
        err = max(float(np.abs(g[k] - g1[k]).max() / max(np.abs(g1[k]).max(), 1e-30)) for k in g1)
    t = json.load(open(d + "/t.json"))
    est = json.load(open(d + "/t.compile.json"))
    tl = t.get("op_profile", {}).get("timeline", [])
    rows.append({
        "model": model, "ranks": int(np_), "stage": stage, "precision": precision,
        "grad_rel_error": err, "communicator": t.get("communicator"),
        "ranks_peaks": [{"rank": r["rank"], "planned": r["predicted_peak_bytes"], "measured": r["measured_peak_bytes"]} for r in t.get("ranks", [])],
        "step_ms": t["step_ms"], "estimated_step_ms": est["estimated_step_ms"],
        "estimated_comm_ms": est.get("estimated_comm_ms"), "estimated_comm_exposed_ms": est.get("estimated_comm_exposed_ms"),
        "measured_collective_wait_ms": [r["collective_wait_ms"] for r in tl],
        "measured_collective_in_flight_ms": [r["collective_in_flight_ms"] for r in tl],
    })
with open(rows_path, "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
print("| model | ranks | stage | precision | grad rel. error | peaks planned = measured | step ms | comm | est. collectives ms (exposed) | measured wait ms, rank 0 |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    same = all(p["planned"] == p["measured"] for p in r["ranks_peaks"]) and len(r["ranks_peaks"]) == r["ranks"]
    e = "n/a" if r["grad_rel_error"] is None else f"{r['grad_rel_error']:.1e}"
    w = r["measured_collective_wait_ms"][0] if r["measured_collective_wait_ms"] else float("nan")
    print(f"| {r['model']} | {r['ranks']} | {r['stage']} | {r['precision']} | {e} | {'yes' if same else 'NO'} "
          f"({r['ranks_peaks'][0]['planned'] if r['ranks_peaks'] else '?'}) | {r['step_ms']:.2f} | {r['communicator']} | "
          f"{r['estimated_comm_ms']:.2f} ({r['estimated_comm_exposed_ms']:.2f}) | {w:.2f} |")
EOF
$py -c 'import json, sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1])], indent=1))' "$rows" > "$out/multi_gpu.json"
