#!/usr/bin/env bash
# Issue 36's device check: memc's training step against PyTorch eager and torch.compile on one
# H200, in one call of under 5 minutes. Rows: ViT-B/16 and ViT-L/16 (the skeletons filled by
# bench/random_weights.py) at batch 16 and 64 in fp32, bf16-mixed and bf16-mixed + --remat blocks,
# and BigBird (models/bigbird_long_skeleton.onnx, original_full attention) at --seq 1024, batch 8,
# bf16-mixed. Each row: memc's step time and its planned and measured peaks, the same step in
# PyTorch eager and under torch.compile (bench/torch_gpu_step.py: the same weights, data, batch,
# AdamW, precision and checkpointing) with torch.cuda.max_memory_allocated, MFU, and the ratios.
#
# memc: `memc compile ONNX --batch B --target h200 --optimizer adamw --lr 1e-3 --epochs 3 [row
# flags] --json` (flops_per_step, the plan), then `memc run PLAN --data X --epochs STEPS --device
# cuda --json R.json` on data of exactly one batch, so each epoch is one step and the run's epoch
# lines ("epoch k/N: 1 steps, ..., S samples/s") give every step's time (the report has only
# their mean, which takes in step 1 run eagerly and step 2 captured as a CUDA graph). memc_ms =
# the median of steps 3..STEPS less the report's batch copy-in per step (loop_step_ms − step_ms),
# to match PyTorch's loop, whose data is on the GPU already; to 0.5/S relative (samples/s is
# printed whole): where S < 50 (a CPU rehearsal) it falls back to the report's mean step_ms.
# PyTorch: --warmup 2 then the median of --runs 5, one process per model for the eager rows
# (--sweep); torch.compile on the batch-16 rows (COMPILE_SCOPE=blocks: each encoder block
# compiled, PyTorch's regional compilation, because a whole ViT-L compiles in about as long as
# this call may take; COMPILE_SCOPE=model for the whole model), each configuration limited to
# COMPILE_TIMEOUT (90 s) and the lot to what the budget leaves; a column left null says why.
# MFU = flops_per_step / step seconds / peak: 989e12 (bf16 dense) or 67e12 (fp32), H200 SXM's
# data sheet. Everything runs in priority order against BUDGET_S (280 s from the start): memc and
# eager rows of ViT-B, then ViT-L, then torch.compile, then BigBird; what the budget cuts is
# recorded as skipped with the reason. The targets (memc ≤ 1.0× eager on every row, bf16 rows ≤
# 0.7× eager, ≤ torch.compile on batch-16 rows, planned == measured, memc's peak ≤ PyTorch's)
# are printed beside the table, not asserted.
#
# The cost model (issue 36 item 7): first `memc calibrate --device cuda --target T` measures the
# card through memc's kernels ($OUT/T_measured.json, a few seconds; T is h200, or h100/a100 where
# nvidia-smi names one, and the plans' --target too); then ViT-B/16 at the first
# batch in fp32 and bf16-mixed runs 3 steps with --profile under MEMC_GPU_PROFILE, whose
# kernel time per op category is set beside the calibrated cost model's estimate per category
# (the target: within 25 %), and their sums beside the row's memc_ms and its data-sheet estimate
# ("cost_model" in gpu_speed.json).
#
# Here:    scripts/device_deps.sh            (memc and the CUDA module into .devdeps/)
# Device:  run(command="bash bench/gpu_speed.sh", carry=[".devdeps"], timeout_s=330)
# Output:  $OUT/gpu_speed.txt (the log, ending in the table), $OUT/gpu_speed.json (header + rows)
# Rehearsal without a GPU: DEVICE=cpu PYTHON=build/python-test-venv/bin/python ROWS=small bash bench/gpu_speed.sh
# runs the same pipeline on the CPU (ViT-B/16 at batch 2, BigBird at batch 2, seq 64; memc plans
# for the CPU; numbers meaningless). Env: MODELS ("b l"), BATCHES ("16 64"), COMPILE_BATCHES
# ("16"), BIGBIRD ("8:1024" = BATCH:SEQ, or none), STEPS (8), WARMUP (2), RUNS (5), BUDGET_S,
# COMPILE_TIMEOUT, COMPILE_SCOPE.
set -uo pipefail
device=${DEVICE:-cuda}
py=${PYTHON:-python3}
target=h200
[[ $device == cpu ]] && target=cpu
if [[ ${ROWS:-all} == small ]]; then
  d_models="b" d_batches="2" d_cbatches="2" d_bigbird="2:64" d_steps=4 d_warmup=1 d_runs=2 d_budget=1500 d_ctimeout=150
else
  d_models="b l" d_batches="16 64" d_cbatches="16" d_bigbird="8:1024" d_steps=8 d_warmup=2 d_runs=5 d_budget=280 d_ctimeout=90
fi
models=${MODELS:-$d_models} batches=${BATCHES:-$d_batches} cbatches=${COMPILE_BATCHES:-$d_cbatches}
bigbird=${BIGBIRD:-$d_bigbird} steps=${STEPS:-$d_steps} warmup=${WARMUP:-$d_warmup} runs=${RUNS:-$d_runs}
budget=${BUDGET_S:-$d_budget} ctimeout=${COMPILE_TIMEOUT:-$d_ctimeout} scope=${COMPILE_SCOPE:-blocks}
t0=$SECONDS
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/memc-gpu-speed}
mkdir -p "$out"
exec > >(tee "$out/gpu_speed.txt") 2>&1
bundle=.devdeps/memc-device.tar.xz
[[ -f $bundle ]] || { echo "no $bundle: run scripts/device_deps.sh and carry .devdeps"; exit 2; }
root=/tmp/memc-device
rm -rf "$root" && mkdir -p "$root" && tar -xJf "$bundle" -C "$root"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
# cuDNN (and NCCL) from PyTorch's wheels; cuBLASLt from the toolkit.
wheel_libs=$($py -c 'import glob, os, nvidia; print(":".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))' 2>/dev/null)
export LD_LIBRARY_PATH="$root/lib:${wheel_libs}:$(dirname "$(dirname "$nvcc")")/lib64:${LD_LIBRARY_PATH:-}"
memc=$root/bin/memc
# What bench/device_check.sh found to make a step differ from the CPU's (its $OUT/device_env, in
# the same call: MEMC_DISABLE_PASSES, MEMC_GROUP_KERNELS) stays off here too, said in the header.
# shellcheck disable=SC1091
[[ -s $out/device_env ]] && source "$out/device_env"
[[ -n ${MEMC_DISABLE_PASSES:-} ]] && echo "optional rewrites off (MEMC_DISABLE_PASSES): $MEMC_DISABLE_PASSES"
[[ ${MEMC_GROUP_KERNELS:-1} == 0 ]] && echo "group kernels off (MEMC_GROUP_KERNELS=0)"
echo "binaries of commit $(cat "$root/COMMIT"); working tree $(git rev-parse HEAD 2>/dev/null || echo '?'); $(date -u +%FT%TZ)"
gpu=cpu
if [[ $device == cuda ]]; then
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1) && [[ -n $gpu ]] ||
    { echo "no GPU: nothing measured"; exit 0; }
  case $gpu in *H100*) target=h100 ;; *A100*) target=a100 ;; esac  # the plans' and the calibration's target: the card lent
fi
echo "device $device ($gpu); budget ${budget} s; models: $models; batches: $batches; torch.compile ($scope) at batch $cbatches; BigBird $bigbird; memc $steps steps, PyTorch $warmup + $runs"
w=/tmp/gpu_speed
rm -rf "$w" && mkdir -p "$w"
export GPU_SPEED_WORK=$w GPU_SPEED_CBATCHES=$cbatches

left() { echo $((budget - (SECONDS - t0))); }
# cap WANT [RESERVE]: WANT seconds, or what the budget has left less RESERVE where that is less (≥ 0)
cap() {
  local want=$1 l=$(($(left) - ${2:-0}))
  ((l < want)) && want=$l
  ((want < 0)) && want=0
  echo "$want"
}
# skip NAME COLUMN REASON: a figure left null, and why
skip() {
  $py -c 'import json, sys; print(json.dumps({"name": sys.argv[1], "column": sys.argv[2], "reason": sys.argv[3]}))' "$1" "$2" "$3" >>"$w/skips.jsonl"
  echo "$1: $2 skipped: $3"
}
stamp() { echo "== $* (t+$((SECONDS - t0)) s, $(left) s of the budget left)"; }

# --- the report: per-row lines as they finish, the table and gpu_speed.json at the end --------
cat >"$w/report.py" <<'EOF'
import glob, json, os, re, statistics, sys
W = os.environ["GPU_SPEED_WORK"]
PEAK = {"bf16-mixed": 989e12, "fp32": 67e12}
SHORT = {"vit_b_16": "vitb16", "vit_l_16": "vitl16", "bigbird_long": "bigbird"}
MODEL = {v: k for k, v in SHORT.items()}
CB = os.environ.get("GPU_SPEED_CBATCHES", "16").replace(" ", ", ")


def cfg(precision, remat):
    return ("bf16" if precision == "bf16-mixed" else "fp32") + ("_remat" if remat == "blocks" else "")


def name(short, batch, c, seq=None):
    return f"{short}{f'_s{seq}' if seq else ''}_b{batch}_{c}"


def mb(b):
    return f"{b / 1e6:,.1f} MB" if isinstance(b, (int, float)) else "-"


def memc(tag, note=None):
    """memc's figures of row `tag`. A run cut short (no report) keeps the steps its epoch lines
    printed, the compile's planned peak, and `note` (why it was cut)."""
    c = json.load(open(f"{W}/{tag}.compile.json"))
    r = json.load(open(f"{W}/{tag}.run.json")) if os.path.exists(f"{W}/{tag}.run.json") else None
    batch = c["batch"]
    steps = []  # (samples, samples/s) per epoch: one step each
    for line in open(f"{W}/{tag}.run.out"):
        m = re.search(r"epoch \d+/\d+: (\d+) steps, mean loss \S+, (\d+) samples/s", line)
        if m:
            steps.append((int(m[1]) * batch, int(m[2])))
    per_step = [round(1e3 * n / s, 3) if s else None for n, s in steps]
    timed = steps[2:]
    if r is None:
        if len(timed) < 1 or not all(s for _, s in timed):
            raise ValueError(f"memc run left no report and {len(steps)} step(s)")
        return {"memc_step_ms_all": per_step, "memc_ms": statistics.median(per_step[2:]),
                "memc_ms_source": f"median of steps 3-{len(per_step)} of a run cut short (epoch lines; batch copy-in included)",
                "memc_ms_resolution": max(0.5 / s for _, s in timed), "memc_note": note,
                "planned_bytes": c["predicted_peak_bytes"], "measured_bytes": None,
                "flops_per_step": c.get("flops_per_step"), "estimated_step_ms": c.get("estimated_step_ms")}
    copy_in = max(r["loop_step_ms"] - r["step_ms"], 0.0)
    f = {"memc_step_ms_all": per_step, "memc_report_step_ms": r["step_ms"], "memc_report_loop_step_ms": r["loop_step_ms"],
         "memc_copy_in_ms": round(copy_in, 3)}
    if len(timed) >= 2 and all(s >= 50 for _, s in timed):
        f["memc_ms"] = statistics.median(per_step[2:]) - copy_in
        f["memc_ms_source"] = f"median of steps 3-{len(per_step)} (epoch lines) less the batch copy-in"
        f["memc_ms_resolution"] = max(0.5 / s for _, s in timed)
    else:
        f["memc_ms"] = r["step_ms"]
        f["memc_ms_source"] = "the report's step_ms (mean of every step, the first two cold): the epoch lines' samples/s too coarse (< 50)"
        f["memc_ms_resolution"] = None
    f.update({"planned_bytes": r["predicted_peak_bytes"], "measured_bytes": r["measured_peak_bytes"],
              "flops_per_step": c.get("flops_per_step"), "estimated_step_ms": c.get("estimated_step_ms"),
              "memc_device": r.get("device"), "memc_status": r.get("status"),
              "memc_first_loss": (r.get("losses") or [None])[0], "memc_last_loss": r.get("loss")})
    return f


def say_memc(tag):
    f = memc(tag)
    mean = f"report mean {f['memc_report_step_ms']:.2f}" if "memc_report_step_ms" in f else "no report: the run was cut short"
    print(f"{tag}: memc {f['memc_ms']:.2f} ms/step (steps {f['memc_step_ms_all']}, {mean}), "
          f"planned {mb(f['planned_bytes'])}, measured {mb(f['measured_bytes'])}, on {f.get('memc_device', '?')}", flush=True)


def torch_lines(kind):
    out = {}
    for path in sorted(glob.glob(f"{W}/{kind}_*.jsonl")):
        for line in open(path):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if "batch" in d:
                out[name(SHORT[d["model"]], d["batch"], cfg(d["precision"], d["remat"]), d.get("seq"))] = d
    return out


def say_torch(kind, line):
    try:
        d = json.loads(line)
    except ValueError:
        return
    if "batch" not in d:
        print(f"torch {kind}: {line.strip()}")
        return
    tag = name(SHORT[d["model"]], d["batch"], cfg(d["precision"], d["remat"]), d.get("seq"))
    if "error" in d:
        print(f"{tag}: torch {kind}: {d['error']}", flush=True)
    else:
        print(f"{tag}: torch {kind} {d['step_ms_median']:.2f} ms/step, max_memory_allocated {mb(d['max_memory_allocated_bytes'])}"
              f", first step {d['first_step_s']:.1f} s", flush=True)


def final(out_dir, header):
    rows, skips = [], {}
    for line in open(f"{W}/skips.jsonl") if os.path.exists(f"{W}/skips.jsonl") else []:
        s = json.loads(line)
        skips.setdefault((s["name"], s["column"]), s["reason"])
    eager, comp = torch_lines("eager"), torch_lines("compile")
    for line in open(f"{W}/manifest.txt"):
        tag, short, batch, c, seq, kinds = line.split()
        seq = int(seq) or None
        precision = "bf16-mixed" if c.startswith("bf16") else "fp32"
        row = {"name": tag, "model": short, "batch": int(batch), "seq": seq, "config": c, "precision": precision,
               "remat": "blocks" if c.endswith("remat") else "none", "compile_attempted": "compile" in kinds.split(",")}
        try:
            row.update(memc(tag, skips.get((tag, "memc"))))
        except (OSError, ValueError, KeyError) as e:
            row["memc_ms"] = None
            row["memc_error"] = skips.get((tag, "memc"), f"no memc figures ({type(e).__name__}: {e})")
        for kind, got, col in (("eager", eager, "torch_eager"), ("compile", comp, "torch_compile")):
            d = got.get(tag)
            if kind not in kinds.split(","):
                row[f"{col}_ms"] = None
                row[f"{col}_error"] = skips.get((tag, kind), f"not attempted: torch.compile runs on the batch-{CB} rows only (time)")
                continue
            if d and "error" not in d:
                row[f"{col}_ms"] = d["step_ms_median"]
                row[f"{col}_peak_bytes"] = d["max_memory_allocated_bytes"]
                row[f"{col}_step_ms_all"] = d["step_ms_all"]
                row[f"{col}_first_step_s"] = d["first_step_s"]
                row[f"{col}_last_loss"] = d["last_loss"]
                if kind == "compile":
                    row["torch_compile_scope"] = d["compile"]
                else:
                    row["torch_tensors_from_onnx"] = f"{d['tensors_from_onnx']} of {d['of']} parameters"
            else:
                row[f"{col}_ms"] = None
                status = f"{W}/{kind}_{MODEL[short]}.status"
                row[f"{col}_error"] = ((d or {}).get("error") or skips.get((tag, kind))
                                       or (f"no result: {open(status).read().strip()}" if os.path.exists(status) else "no result"))
        row["torch_peak_bytes"] = row.get("torch_eager_peak_bytes")
        ms, fl = row.get("memc_ms"), row.get("flops_per_step")
        row["peak_flops"] = PEAK[precision]
        row["mfu"] = fl / (ms / 1e3) / PEAK[precision] if ms and fl else None
        if row["remat"] == "blocks":  # flops_per_step counts the recomputed forward: MFU of the model's own FLOPs beside it
            plain = next((r for r in rows if r["model"] == short and r["batch"] == int(batch) and r["seq"] == seq
                          and r["precision"] == precision and r["remat"] == "none" and r.get("flops_per_step")), None)
            if plain and ms:
                row["model_flops_per_step"] = plain["flops_per_step"]
                row["mfu_model_flops"] = plain["flops_per_step"] / (ms / 1e3) / PEAK[precision]
        for col in ("torch_eager", "torch_compile"):
            t = row.get(f"{col}_ms")
            if t and fl:
                row[f"{col}_mfu"] = fl / (t / 1e3) / PEAK[precision]
        row["memc_over_eager"] = ms / row["torch_eager_ms"] if ms and row.get("torch_eager_ms") else None
        row["memc_over_compile"] = ms / row["torch_compile_ms"] if ms and row.get("torch_compile_ms") else None
        rows.append(row)

    f = lambda v, p=".2f": "-" if v is None else format(v, p)
    print("\n| row | memc ms | eager ms | compile ms | memc/eager | memc/compile | planned | measured | PyTorch peak | MFU memc (eager) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        mfu = "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f} %" + (f" ({100 * r['torch_eager_mfu']:.1f} %)" if r.get("torch_eager_mfu") else "")
        print(f"| {r['name']} | {f(r.get('memc_ms'))} | {f(r.get('torch_eager_ms'))} | {f(r.get('torch_compile_ms'))} | "
              f"{f(r.get('memc_over_eager'))} | {f(r.get('memc_over_compile'))} | {mb(r.get('planned_bytes'))} | "
              f"{mb(r.get('measured_bytes'))} | {mb(r.get('torch_peak_bytes'))} | {mfu} |")
    nulls = [(r["name"], k, r[k]) for r in rows for k in ("memc_error", "torch_eager_error", "torch_compile_error") if k in r]
    if nulls:
        print("\nnull figures:")
        for n, k, why in nulls:
            print(f"  {n} {k.replace('_error', '')}: {why}")

    def target(label, rs, ok, show):
        have = [r for r in rs if ok(r) is not None]
        bad = [r for r in have if not ok(r)]
        line = f"{label}: {len(have) - len(bad)} of {len(have)} rows" + (f" (of {len(rs)}; the rest lack a figure)" if len(have) < len(rs) else "")
        if bad:
            line += "; not met: " + ", ".join(f"{r['name']} ({show(r)})" for r in bad)
        print("  " + line)
        return {"target": label, "met": len(have) - len(bad), "of": len(have), "rows": len(rs), "not_met": [r["name"] for r in bad]}

    ratio = lambda k, lim: (lambda r: None if r.get(k) is None else r[k] <= lim)
    print("\ntargets (printed, not asserted):")
    targets = [
        target("memc <= 1.0x eager, every row", rows, ratio("memc_over_eager", 1.0), lambda r: f"{r['memc_over_eager']:.2f}x"),
        target("memc <= 0.7x eager, bf16 rows", [r for r in rows if r["precision"] == "bf16-mixed"], ratio("memc_over_eager", 0.7),
               lambda r: f"{r['memc_over_eager']:.2f}x"),
        target(f"memc <= torch.compile, batch-{CB} rows", [r for r in rows if r["compile_attempted"]],
               ratio("memc_over_compile", 1.0), lambda r: f"{r['memc_over_compile']:.2f}x"),
        target("planned == measured", rows, lambda r: None if r.get("measured_bytes") is None else r["planned_bytes"] == r["measured_bytes"],
               lambda r: f"{mb(r['planned_bytes'])} vs {mb(r['measured_bytes'])}"),
        target("memc peak <= PyTorch peak (max_memory_allocated, eager)", rows,
               lambda r: None if r.get("measured_bytes") is None or r.get("torch_peak_bytes") is None else r["measured_bytes"] <= r["torch_peak_bytes"],
               lambda r: f"{mb(r['measured_bytes'])} vs {mb(r['torch_peak_bytes'])}"),
    ]
    versions = {d.get("torch") for d in list(eager.values()) + list(comp.values()) if d.get("torch")}
    header["torch"] = ", ".join(sorted(versions)) or None
    header["targets"] = targets
    json.dump({"header": header, "rows": rows}, open(f"{out_dir}/gpu_speed.json", "w"), indent=1)
    print(f"\nwrote {out_dir}/gpu_speed.json ({len(rows)} rows)")


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "memc":
        say_memc(sys.argv[2])
    elif what == "torch":
        say_torch(sys.argv[2], sys.argv[3])
    elif what == "final":
        final(sys.argv[2], json.loads(sys.argv[3]))
EOF
: >"$w/manifest.txt"

# --- data (one batch per file: memc's epochs are then its steps) and weights -----------------
$py - "$w" "$batches" "$bigbird" <<'EOF'
import sys
import numpy as np
w, batches, bb = sys.argv[1], [int(b) for b in sys.argv[2].split()], sys.argv[3]
rng = np.random.default_rng(0)
n = max(batches)
x, y = rng.standard_normal((n, 3, 224, 224), dtype=np.float32), rng.integers(0, 1000, n)
for b in batches:
    np.savez(f"{w}/vit224_{b}.npz", x=x[:b], y=y[:b])
if bb != "none":
    b, s = map(int, bb.split(":"))
    rng = np.random.default_rng(s)
    np.savez(f"{w}/bigbird_{b}x{s}.npz", input_ids=rng.integers(5, 50358, (b, s)).astype(np.int64),
             attention_mask=np.ones((b, s), np.int64), y=rng.integers(0, 2, b).astype(np.int64))
EOF
# --- 0. the cost model's measured profile of this device, before the weights load the CPU
stamp "memc calibrate"
profile=$out/${target}_measured.json
cal=()
[[ $device == cuda ]] && cal=(--device cuda --target "$target")
timeout "$(cap 40 200)" "$memc" calibrate "${cal[@]}" --seconds 0.2 -o "$profile" --force >"$w/calibrate.out" 2>&1
echo "calibrate exit $?"
cat "$w/calibrate.out"
profile_env() { [[ $target == cpu ]] && echo "MEMC_CPU_PROFILE=$profile" || echo "MEMC_GPU_PROFILE=$profile"; }
# profile_plan TAG DATA: 3 steps (of one batch each) with --profile, the estimates from the measured profile
profile_plan() {
  local tag=$1 data=$2 t
  [[ -s $profile && $(cat "$w/$tag.compile.rc" 2>/dev/null) == 0 ]] || { echo "$tag: no profile run (no measured profile or plan)"; return; }
  t=$(cap 30 5)
  ((t >= 10)) || { echo "$tag: no profile run: time budget ($(left) s left)"; return; }
  env "$(profile_env)" timeout "$t" "$memc" run "$w/$tag.plan" --data "$data" --epochs 3 --device "$device" --profile --force \
    --json "$w/$tag.profile.json" >"$w/$tag.profile.out" 2>&1 || echo "$tag: profile run exit $?: $(tail -1 "$w/$tag.profile.out")"
  grep -A8 "kernel time per step" "$w/$tag.profile.out"
}

declare -A wpid
skeleton() { case $1 in b) echo models/vit_b_16_skeleton.onnx ;; l) echo models/vit_l_16_skeleton.onnx ;; bigbird) echo models/bigbird_long_skeleton.onnx ;; esac; }
for m in $models $([[ $bigbird != none ]] && echo bigbird); do  # all at once, on the CPU, while the GPU works
  $py bench/random_weights.py "$(skeleton "$m")" "$w/$m.onnx" >"$w/weights_$m.log" 2>&1 &
  wpid[$m]=$!
done
weights() {  # weights M: waits for $w/M.onnx
  wait "${wpid[$1]}" && [[ -s $w/$1.onnx ]] || { echo "random_weights.py $(skeleton "$1") failed: $(tail -1 "$w/weights_$1.log")"; return 1; }
}

flags_of() { case $1 in fp32) ;; bf16) echo --precision bf16-mixed ;; bf16_remat) echo --precision bf16-mixed --remat blocks ;; esac; }
compile_plan() {  # TAG ONNX BATCH FLAGS...: the plan and its --json summary (run in the background)
  local tag=$1 onnx=$2 batch=$3
  shift 3
  timeout 120 "$memc" compile "$onnx" --batch "$batch" --target "$target" --optimizer adamw --lr 1e-3 --epochs 3 "$@" \
    -o "$w/$tag.plan" --force --json >"$w/$tag.compile.json" 2>"$w/$tag.compile.err"
  echo $? >"$w/$tag.compile.rc"
}
run_plan() {  # TAG DATA: memc run, one line when done
  local tag=$1 data=$2 t rc
  if [[ $(cat "$w/$tag.compile.rc" 2>/dev/null) != 0 ]]; then
    skip "$tag" memc "memc compile failed (exit $(cat "$w/$tag.compile.rc" 2>/dev/null)): $(tail -1 "$w/$tag.compile.err")"
    return
  fi
  t=$(cap 90 5)
  ((t >= 10)) || { skip "$tag" memc "time budget ($(left) s left)"; return; }
  timeout "$t" "$memc" run "$w/$tag.plan" --data "$data" --epochs "$steps" --device "$device" --force --json "$w/$tag.run.json" >"$w/$tag.run.out" 2>&1
  rc=$?
  if ((rc != 0)); then
    rm -f "$w/$tag.run.json"
    skip "$tag" memc "memc run exit $rc$( ((rc == 124)) && echo " (timeout $t s)"): $(grep -v '^epoch' "$w/$tag.run.out" | tail -1)"
    $py "$w/report.py" memc "$tag" 2>/dev/null  # the steps it printed, if enough
    return
  fi
  $py "$w/report.py" memc "$tag"
}
# torch_rows KIND(eager|compile) MODEL ONNX DATA TIMEOUT SEQ CONFIGS: one bench/torch_gpu_step.py
# process (--sweep), a line per configuration as it finishes
torch_rows() {
  local kind=$1 model=$2 onnx=$3 data=$4 t=$5 seq=$6 configs=$7 extra=() rc
  [[ $kind == compile ]] && extra=(--compile --compile-scope "$scope" --compile-timeout "$ctimeout")
  timeout "$t" "$py" bench/torch_gpu_step.py --model "$model" --onnx "$onnx" --data "$data" --device "$device" \
    --warmup "$warmup" --runs "$runs" --sweep "$configs" "${extra[@]}" 2>"$w/${kind}_$model.err" |
    while IFS= read -r line; do
      echo "$line" >>"$w/${kind}_$model.jsonl"
      $py "$w/report.py" torch "$kind" "$line"
    done
  rc=${PIPESTATUS[0]}
  if ((rc != 0)); then
    echo "exit $rc$( ((rc == 124)) && echo " (timeout: $t s left to this process)") before this configuration: $(grep -v -E '^(W[0-9]|  )' "$w/${kind}_$model.err" | tail -1 | cut -c1-300)" >"$w/${kind}_$model.status"
    echo "torch $kind $model: $(cat "$w/${kind}_$model.status")"
  fi
  return 0
}
tv() { case $1 in b) echo vit_b_16 ;; l) echo vit_l_16 ;; esac; }

# --- 1. ViT rows: memc (plans compiled in parallel, then run one at a time), then PyTorch eager
maxb=$(tr ' ' '\n' <<<"$batches" | sort -n | tail -1)
for m in $models; do
  stamp "ViT-${m^^}/16: memc"
  configs=""
  for b in $batches; do
    for c in fp32 bf16 bf16_remat; do
      kinds=eager
      [[ " $cbatches " == *" $b "* ]] && kinds=eager,compile
      echo "vit${m}16_b${b}_$c vit${m}16 $b $c 0 $kinds" >>"$w/manifest.txt"
      configs+="$b:$([[ $c == fp32 ]] && echo fp32 || echo bf16-mixed):$([[ $c == *remat ]] && echo blocks || echo none),"
    done
  done
  weights "$m" || { for b in $batches; do for c in fp32 bf16 bf16_remat; do skip "vit${m}16_b${b}_$c" memc "no weights"; done; done; continue; }
  cpids=()
  for b in $batches; do
    for c in fp32 bf16 bf16_remat; do
      # shellcheck disable=SC2046
      compile_plan "vit${m}16_b${b}_$c" "$w/$m.onnx" "$b" $(flags_of $c) &
      cpids+=($!)
    done
  done
  wait "${cpids[@]}"
  for b in $batches; do
    for c in fp32 bf16 bf16_remat; do run_plan "vit${m}16_b${b}_$c" "$w/vit224_$b.npz"; done
  done
  if [[ $m == "${models%% *}" ]]; then
    stamp "ViT-${m^^}/16: the cost model per op category"
    b=${batches%% *}
    for c in fp32 bf16; do profile_plan "vit${m}16_b${b}_$c" "$w/vit224_$b.npz"; done
  fi
  stamp "ViT-${m^^}/16: PyTorch eager"
  t=$(cap 150 5)
  if ((t >= 20)); then
    torch_rows eager "$(tv "$m")" "$w/$m.onnx" "$w/vit224_$maxb.npz" "$t" 0 "$configs"
  else
    for b in $batches; do for c in fp32 bf16 bf16_remat; do skip "vit${m}16_b${b}_$c" eager "time budget ($(left) s left)"; done; done
  fi
done

# --- 2. torch.compile on the batch-16 rows: what is left, shared between the models, BigBird's ~50 s kept
reserve_bb=0
[[ $bigbird != none ]] && reserve_bb=50
n_left=$(wc -w <<<"$models")
for m in $models; do
  stamp "ViT-${m^^}/16: torch.compile ($scope)"
  share=$((($(left) - reserve_bb - 5) / n_left))
  n_left=$((n_left - 1))
  configs=""
  for b in $cbatches; do configs+="$b:bf16-mixed:none,$b:bf16-mixed:blocks,$b:fp32:none,"; done
  if [[ -s $w/$m.onnx ]] && ((share >= 30)); then
    torch_rows compile "$(tv "$m")" "$w/$m.onnx" "$w/vit224_$maxb.npz" "$share" 0 "$configs"
  else
    for b in $cbatches; do
      for c in fp32 bf16 bf16_remat; do
        skip "vit${m}16_b${b}_$c" compile "time budget ($(left) s left, $reserve_bb s of it kept for BigBird: under 30 s for this model's compile process)"
      done
    done
  fi
done

# --- 3. BigBird at --seq S: memc, PyTorch eager (transformers' model, the same weights), torch.compile if time is left
if [[ $bigbird != none ]]; then
  bb=${bigbird%%:*} seq=${bigbird#*:}
  tag=bigbird_s${seq}_b${bb}_bf16
  echo "$tag bigbird $bb bf16 $seq eager,compile" >>"$w/manifest.txt"
  stamp "BigBird seq $seq batch $bb: memc"
  if weights bigbird; then
    compile_plan "$tag" "$w/bigbird.onnx" "$bb" --seq "$seq" --precision bf16-mixed
    run_plan "$tag" "$w/bigbird_${bb}x$seq.npz"
    stamp "BigBird: PyTorch eager"
    t=$(cap 90 5)
    if ((t >= 20)); then
      torch_rows eager bigbird_long "$w/bigbird.onnx" "$w/bigbird_${bb}x$seq.npz" "$t" "$seq" "$bb:bf16-mixed:none"
    else
      skip "$tag" eager "time budget ($(left) s left)"
    fi
    t=$(cap 90 5)
    if ((t >= 40)); then
      stamp "BigBird: torch.compile ($scope)"
      torch_rows compile bigbird_long "$w/bigbird.onnx" "$w/bigbird_${bb}x$seq.npz" "$t" "$seq" "$bb:bf16-mixed:none"
    else
      skip "$tag" compile "time budget ($(left) s left; the ViT rows came first)"
    fi
  else
    for k in memc eager compile; do skip "$tag" $k "no weights"; done
  fi
fi

# --- the table and gpu_speed.json
stamp "summary"
header=$($py -c 'import json, sys; a = sys.argv[1:]; print(json.dumps({
  "date": a[0], "device": a[1], "gpu": a[2], "memc_commit": a[3], "working_tree": a[4], "target": a[5],
  "peak_flops": {"bf16-mixed": 989e12, "fp32": 67e12, "source": "H200 SXM data sheet, dense (no sparsity): BF16 989 TFLOPS, FP32 67 TFLOPS"},
  "mfu": "flops_per_step (memc compile --json; with --remat it counts the recomputed forward) / step seconds / peak_flops[precision]; remat rows add mfu_model_flops, with the flops of the same row without remat",
  "memc": "memc compile --target T --optimizer adamw --lr 1e-3 --epochs 3 [flags]; memc run --epochs STEPS on one batch of data; memc_ms = median of steps 3.. less the copy-in",
  "torch": None, "settings": {"steps": int(a[6]), "warmup": int(a[7]), "runs": int(a[8]), "compile_scope": a[9],
  "compile_timeout_s": int(a[10]), "budget_s": int(a[11]), "elapsed_s": int(a[12]), "tf32": False,
  "disabled_passes": a[13] or None, "group_kernels": a[14] != "0"}}))' \
  "$(date -u +%FT%TZ)" "$device" "$gpu" "$(cat "$root/COMMIT")" "$(git rev-parse HEAD 2>/dev/null || echo '?')" "$target" \
  "$steps" "$warmup" "$runs" "$scope" "$ctimeout" "$budget" "$((SECONDS - t0))" "${MEMC_DISABLE_PASSES:-}" "${MEMC_GROUP_KERNELS:-1}")
$py "$w/report.py" final "$out" "$header"
# the cost model: measured profile, per category (profile runs) and per step (every memc row)
$py - "$out" "$w" "$profile" <<'EOF2'
import glob, json, os, sys
out, w, profile = sys.argv[1:4]
doc = json.load(open(f"{out}/gpu_speed.json"))
cm = {"profile": json.load(open(profile)) if os.path.exists(profile) else None, "categories": {}, "steps": {}}
for path in sorted(glob.glob(f"{w}/*.profile.json")):
    tag = os.path.basename(path)[:-len(".profile.json")]
    p = json.load(open(path)).get("op_profile") or {}
    meas, est = p.get("category_ms_per_step", {}), p.get("estimated_category_ms_per_step", {})
    cm["categories"][tag] = {k: {"measured_ms": meas.get(k), "estimated_ms": est.get(k)} for k in sorted(set(meas) | set(est))}
    # each op's rate (memc run --profile --json: the plan's bytes and FLOPs per step over its time):
    # which kernels sit below the card's bandwidth or GEMM peak, the next work's list
    ops = sorted(p.get("ops", []), key=lambda o: -o.get("ms_per_step", 0))
    cm.setdefault("ops", {})[tag] = [{k: o.get(k) for k in ("op", "category", "ms_per_step", "calls", "gb_per_s", "tflop_per_s",
                                                              "estimated_ms_per_step")} for o in ops]
    print(f"\nops, {tag}: ms a step, GB/s moved, TFLOP/s")
    for o in ops[:24]:
        print(f"  {o['op']:26s} {o.get('ms_per_step', 0):8.3f} ms {o.get('gb_per_s') or 0:8.0f} GB/s {o.get('tflop_per_s') or 0:8.2f} TFLOP/s")
    print(f"\ncost model, {tag} (estimates from the measured profile; target: each category within 25 %)")
    for k, v in cm["categories"][tag].items():
        m, e = v["measured_ms"], v["estimated_ms"]
        err = f"{(e - m) / m:+.0%}" if m and e is not None else "-"
        print(f"  {k:14s} measured {m if m is not None else float('nan'):9.2f} ms  estimated {e if e is not None else float('nan'):9.2f} ms  {err}")
rows = {r.get("name"): r for r in doc.get("rows", [])}
for tag, cats in cm["categories"].items():  # the whole step: kernels' sum, the estimates, the timed step
    meas = sum(v["measured_ms"] or 0 for v in cats.values())
    est = sum(v["estimated_ms"] or 0 for v in cats.values())
    row = rows.get(tag, {})
    cm["steps"][tag] = {"kernel_ms": meas, "estimated_ms_measured_profile": est, "memc_ms": row.get("memc_ms"),
                        "estimated_ms_data_sheet": row.get("estimated_step_ms")}
    print(f"  {tag}: kernels {meas:.2f} ms, estimated {est:.2f} ms with the measured profile, "
          f"{row.get('estimated_step_ms')} ms with the data sheet; memc_ms {row.get('memc_ms')}")
doc["cost_model"] = cm
json.dump(doc, open(f"{out}/gpu_speed.json", "w"), indent=1)
EOF2
mkdir -p "$out/work"  # the runs' own output, for a failure's cause (each file's last 20 kB)
for f in "$w"/*.run.out "$w"/*.compile.err "$w"/*.err "$w"/*.jsonl "$w"/*.status "$w"/manifest.txt; do
  [[ -s $f ]] && tail -c 20000 "$f" >"$out/work/$(basename "$f")"
done
echo "done in $((SECONDS - t0)) s"
