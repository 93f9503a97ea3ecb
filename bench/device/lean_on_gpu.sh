#!/usr/bin/env bash
# Issue 32 on a machine that has CUDA: a CPU run maps none of CUDA's libraries even where they are
# installed and a GPU is present; a GPU run opens the CUDA module. Peak RSS of each.
# Device: run(command="bash bench/device/lean_on_gpu.sh", carry=[".devdeps"])  (after scripts/device_deps.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=/tmp/memc-lean && rm -rf "$root" && mkdir -p "$root" && tar -xJf .devdeps/memc-device.tar.xz -C "$root"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
wheel_libs=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))' 2>/dev/null)
export LD_LIBRARY_PATH="$root/lib:$(dirname "$(dirname "$nvcc")")/lib64:${wheel_libs}:${LD_LIBRARY_PATH:-}"
memc=$root/bin/memc
echo "binaries of commit $(cat "$root/COMMIT"); $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null); $(grep -m1 'model name' /proc/cpuinfo)"
rss() { /usr/bin/time -f "%M" "$@" 2>&1 >/dev/null | tail -1; }
echo "memc --version: peak RSS $(rss "$memc" --version) KiB"
"$memc" compile models/vit_tiny.onnx --batch 32 --optimizer adamw --lr 2e-3 --epochs 1 -o /tmp/lean.plan --force >/dev/null || exit 1
for device in cpu cuda; do
  LD_DEBUG=files "$memc" run /tmp/lean.plan --data data/digits_train.npz --device $device --quiet --json /tmp/lean_$device.json --force 2>/tmp/lean_$device.ld >/dev/null
  cuda_libs=$(grep -oE "file=[^ ]*(cuda|cublas|cudnn|nccl|cudart)[^ ]*" /tmp/lean_$device.ld | sed 's/file=//' | sort -u | tr '\n' ' ')
  python3 -c "import json,sys; r=json.load(open('/tmp/lean_$device.json')); print('$device: loss %.4f, step %.2f ms, loop %.2f ms, peak RSS %.1f MiB, device peak %d = planned %d: %s' % (r['loss'], r['step_ms'], r['loop_step_ms'], r['process_peak_rss_bytes']/2**20, r['measured_peak_bytes'], r['predicted_peak_bytes'], r['measured_peak_bytes']==r['predicted_peak_bytes']))"
  echo "$device: CUDA objects loaded: ${cuda_libs:-none}"
done
