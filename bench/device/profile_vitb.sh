# The per-op time of ViT-B/16 b16 on the GPU (fp32 and bf16-mixed), memc run --profile.
# Device: run(command="bash bench/device/profile_vitb.sh 2>&1 | tee $OUT/profile.txt", carry=[".devdeps"], timeout_s=200)
# after scripts/device_deps.sh here.
set -u
root=/tmp/m; rm -rf $root; mkdir -p $root; tar -xJf .devdeps/memc-device.tar.xz -C $root
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
wl=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))')
export LD_LIBRARY_PATH="$root/lib:$(dirname "$(dirname "$nvcc")")/lib64:$wl"
python3 -c 'import numpy as np; r=np.random.default_rng(0); np.savez("/tmp/v.npz", x=r.standard_normal((32,3,224,224),dtype=np.float32), y=r.integers(0,1000,32))'
python3 bench/random_weights.py models/vit_b_16_skeleton.onnx /tmp/vitb.onnx
for p in fp32 bf16-mixed; do
  $root/bin/memc compile /tmp/vitb.onnx --batch 16 --optimizer adamw --lr 1e-3 --epochs 3 --precision $p --target h200 -o /tmp/p.plan --force >/dev/null
  echo "== vitb $p"; timeout 120 $root/bin/memc run /tmp/p.plan --data /tmp/v.npz --steps 6 --device cuda --profile --quiet --force 2>&1 | head -60
done
