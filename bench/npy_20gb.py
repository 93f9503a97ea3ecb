"""Data far larger than memory (issue 31): 20 GiB of .npy shards, trained on by `memc run --data DIR`
under an address-space limit and by `plan.fit(DIR)` from Python, reading rows of the seeded
shuffle over all shards. Reports each process's peak RSS against the plan's peak: memory does not
grow with the data (labels are read whole: 8 bytes a row; inputs a batch at a time with pread).

    python bench/npy_20gb.py [--gib 20] [--steps 200] [--dir /tmp/memc_npy20] [--keep]

Writes the shards first (distinct rows: a row's values come from its index), unless --dir holds
them already. Prints the CPU model; needs `pip install .` (the memc package) and build/memc.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import memc
from cpu_info import cpu_model  # bench/cpu_info.py

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ROW = (3, 32, 32)
ROW_BYTES = 3 * 32 * 32 * 4




def write_shards(folder, gib, shards):
    rows = gib * (1 << 30) // ROW_BYTES
    os.makedirs(folder, exist_ok=True)
    base = np.linspace(-1, 1, 3 * 32 * 32, dtype=np.float32).reshape(1, *ROW)
    t0 = time.time()
    for k, part in enumerate(np.array_split(np.arange(rows), shards)):
        path = os.path.join(folder, f"x.{k}.npy")
        x = np.lib.format.open_memmap(path + ".part", mode="w+", dtype=np.float32, shape=(len(part), *ROW))
        for start in range(0, len(part), 8192):
            index = part[start:start + 8192].astype(np.float32).reshape(-1, 1, 1, 1)
            x[start:start + 8192] = np.sin(base * (1 + index % 97) + index / 1e5)
        x.flush()
        del x
        os.replace(path + ".part", path)
        np.save(os.path.join(folder, f"y.{k}.npy"), (part * 7919 % 10).astype(np.int64))
    print(f"wrote {rows} rows, {rows * ROW_BYTES / (1 << 30):.2f} GiB in {shards} shards, {time.time() - t0:.0f} s", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=int, default=20)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dir", default="/tmp/memc_npy20")
    parser.add_argument("--limit-mib", type=int, default=1024, help="ulimit -v for memc run and RLIMIT_AS for the Python child")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--memc", default=os.path.join(SRC, "build", "memc"))
    args = parser.parse_args()
    print(f"CPU {cpu_model()}, {os.cpu_count()} cores; vit_small32 b16 AdamW fp32 on {args.gib} GiB of .npy shards")
    done = os.path.join(args.dir, "DONE")
    if not os.path.exists(done):
        shutil.rmtree(args.dir, ignore_errors=True)
        write_shards(args.dir, args.gib, args.shards)
        open(done, "w").close()
    total = sum(os.path.getsize(os.path.join(args.dir, f)) for f in os.listdir(args.dir) if f.startswith("x."))
    with tempfile.TemporaryDirectory() as tmp:
        plan = memc.compile(os.path.join(SRC, "models", "vit_small32.onnx"), batch=16, optimizer="adamw", lr=1e-3, epochs=1,
                            output=os.path.join(tmp, "p.plan"))
        report = os.path.join(tmp, "run.json")
        t0 = time.time()
        subprocess.run(["bash", "-c", f'ulimit -v {args.limit_mib * 1024} && exec "$@"', "run", args.memc, "run", plan.path, "--data", args.dir,
                        "--steps", str(args.steps), "--quiet", "--json", report, "--force"], check=True)
        r = json.load(open(report))
        print(f"memc run --data ({total / (1 << 30):.2f} GiB, ulimit -v {args.limit_mib} MiB): {r['steps']} steps in {time.time() - t0:.0f} s, "
              f"loss {r['losses'][0]:.4f} -> {r['loss']:.4f}; peak RSS {r['process_peak_rss_bytes'] / (1 << 20):.1f} MiB, "
              f"plan {r['predicted_peak_bytes'] / (1 << 20):.1f} MiB, measured {r['measured_peak_bytes'] / (1 << 20):.1f} MiB")
        # Python: plan.fit on the folder in a child under RLIMIT_AS (the parent's torch-free heap stays out of it).
        child = f"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({args.limit_mib} << 20, {args.limit_mib} << 20))
import memc
plan = memc.load_plan({plan.path!r})
r = plan.fit({args.dir!r}, steps={args.steps})
hwm = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')][0] * 1024
print(json.dumps({{'steps': r['steps'], 'loss': r['loss'], 'rss': hwm, 'measured': r['measured_peak_bytes'], 'predicted': r['predicted_peak_bytes']}}))
"""
        t0 = time.time()
        out = subprocess.run([sys.executable, "-c", child], check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        p = json.loads(out)
        print(f"plan.fit(folder) in Python (RLIMIT_AS {args.limit_mib} MiB): {p['steps']} steps in {time.time() - t0:.0f} s, loss {p['loss']:.4f}; "
              f"peak RSS {p['rss'] / (1 << 20):.1f} MiB (the interpreter and NumPy included), measured {p['measured'] / (1 << 20):.1f} MiB "
              f"= planned {p['predicted'] / (1 << 20):.1f} MiB: {p['measured'] == p['predicted']}")
    if not args.keep:
        shutil.rmtree(args.dir)


if __name__ == "__main__":
    main()
