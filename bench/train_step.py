#!/usr/bin/env python3
"""memc vs PyTorch: wall time of one training step (forward + cross-entropy +
backward + AdamW), same model, batch, optimizer, no dropout (--dropout: the exported
p = 0.1 in both), same thread count, same precision.

    /work/venv/bin/python bench/train_step.py                 # defaults below, ~3-5 min on 2 cores
    /work/venv/bin/python bench/train_step.py --reps 3 --threads 1 --models vit_tiny --json /tmp/r.json
    /work/venv/bin/python bench/train_step.py --precisions fp32,bf16-mixed   # twice the time
    /work/venv/bin/python bench/train_step.py --baseline /work/old/build/memc   # an earlier build alongside

Cases: vit_tiny batch 64 (data/digits_train.npz), vit_small32 batch 32 (synthetic
3x32x32 data written by `torch_train_step.py --write-data`), vit_b_16 batch 8 (the
skeleton with bench/random_weights.py's weights in /tmp, torchvision's vit_b_16 loading
the same tensors; 3 batches of N(0,1) images), each with 1 and 2 threads
(OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = MKL_NUM_THREADS = T; OMP_WAIT_POLICY only with --wait-policy
for both processes; memc reports the policy it chose), `memc run --threads T`, torch.set_num_threads(T) inside
torch_train_step.py).

Precisions (--precisions, default fp32; a comma list of fp32 and bf16-mixed): each case is
run in each. fp32: memc's plan compiled without --precision (its default, fp32), torch all
f32. bf16-mixed: `memc compile ... --precision bf16-mixed` (everything else identical), and
`torch_train_step.py --precision bf16-mixed`: f32 parameters and AdamW state, forward + loss
under torch.autocast(device_type="cpu", dtype=torch.bfloat16), backward outside it, no
GradScaler. Same weights, data, batch and optimizer in both. Each table row and JSON case
names its precision; memc's run report's decisions.precision is checked against it.

Method
  memc: `memc compile MODEL --batch B --optimizer adamw --no-dropout --epochs 1000 --threads T -o PLAN`
        (the --epochs only makes sure --steps is not capped at one epoch; bf16-mixed adds
        `--precision bf16-mixed`, one plan per precision), then per rep
        `memc run PLAN --data D --steps WARMUP+STEPS --json R.json` WITHOUT --quiet:
        memc prints one line per step, `... loss L <B*1000/ms> samples/s`, where ms is
        the wall time of that step's execute() call (runtime/trainer.cc; batch
        assembly and the state copy-back are outside it). Per-step ms = B*1000/that
        number (printed with %.0f, so the resolution is ~0.01 % for vit_tiny and ~0.5 %
        for vit_small32). The first WARMUP steps are dropped. As a cross-check the
        mean of all parsed steps is compared with the JSON `step_ms` (mean over all
        steps, warm-up included).
  torch: `bench/torch_train_step.py --model M --batch B --threads T --no-dropout
        --warmup WARMUP --runs STEPS --precision P`; its `step_ms_all` (timed steps only)
        is used.
  Reps alternate memc and torch runs (and the order of the (threads, precision) pairs)
  so that load from other processes hits both alike. Reported: median over all
  post-warm-up steps of all reps, and the min..max of the per-rep medians (spread), plus
  load averages.
"""
import argparse
import hashlib
import shutil
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMC = os.path.join(ROOT, "build", "memc")
PY = sys.executable
CASES = {"vit_tiny": 64, "vit_small32": 32, "vit_b_16": 8}
VIT_B16_ONNX, VIT_B16_DATA = "/tmp/vit_b_16_random.onnx", "/tmp/vit_b_16_data.npz"
STEP_RE = re.compile(r"step \d+/\d+ loss \S+ (\d+) samples/s")
PRECISIONS = ("fp32", "bf16-mixed")
WAIT_POLICY = None  # --wait-policy


def env_for(threads):
    e = dict(os.environ)
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        e[k] = str(threads)
    # By default each framework waits at OpenMP barriers as it would for a user: memc chooses
    # (tools/preinit.cc: a bounded spin where the other cores are idle, else passive; its report's
    # host_memory.omp_wait says which), torch keeps libgomp's default. --wait-policy sets
    # OMP_WAIT_POLICY for both.
    if WAIT_POLICY:
        e["OMP_WAIT_POLICY"] = WAIT_POLICY
    return e


def run_child(cmd, env):
    """Runs cmd, returns (stdout, stderr, wall_s, rusage of the child)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    # communicate() has reaped the child; per-child rusage via RUSAGE_CHILDREN deltas is
    # taken by the caller.
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    return out, err, wall


def run_child_pty_stderr(cmd, env):
    """Like run_child, but stderr is a pseudo-terminal: memc prints its per-step
    line (`... loss L N samples/s`) only when stderr is a terminal (since the change to
    one line per epoch otherwise); older builds print it to any stderr."""
    import pty
    master, slave = pty.openpty()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 65536)
        except OSError:  # EIO once the child has closed the terminal
            break
        if not b:
            break
        chunks.append(b)
    out = p.stdout.read().decode()
    p.wait()
    wall = time.perf_counter() - t0
    os.close(master)
    err = b"".join(chunks).decode(errors="replace")
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    return out, err, wall


def children_usage():
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime, r.ru_stime, r.ru_minflt


def memc_rep(plan, data, batch, steps, warmup, threads, tmp, precision, binary=None):
    binary = binary or MEMC
    rj = os.path.join(tmp, "report.json")
    u0 = children_usage()
    _, err, wall = run_child_pty_stderr([binary, "run", plan, "--data", data, "--steps", str(warmup + steps), "--json", rj,
                                         "--threads", str(threads), "--force"],
                             env_for(threads))
    u1 = children_usage()
    sps = [int(m.group(1)) for m in STEP_RE.finditer(err)]
    if len(sps) != warmup + steps:
        raise SystemExit(f"memc printed {len(sps)} step lines, expected {warmup + steps}:\n{err[-1000:]}")
    rep = json.load(open(rj))
    planned = rep.get("decisions", {}).get("precision")
    if planned is not None and planned != precision:
        raise SystemExit(f"memc ran the plan in {planned}, wanted {precision}: {plan}")
    if rep.get("measured_peak_bytes") != rep.get("predicted_peak_bytes"):
        print(f"  note: measured peak {rep.get('measured_peak_bytes')} != planned {rep.get('predicted_peak_bytes')} ({plan})",
              file=sys.stderr, flush=True)
    if min(sps) >= 100:
        ms = [batch * 1000.0 / s for s in sps]
    else:  # `samples/s` (printed with %.0f) is too coarse: timed mean = difference of two runs' JSON means
        run_child_pty_stderr([binary, "run", plan, "--data", data, "--steps", str(warmup), "--json", rj,
                              "--threads", str(threads), "--force"], env_for(threads))
        first_ms = json.load(open(rj))["step_ms"] * warmup
        timed = (rep["step_ms"] * (warmup + steps) - first_ms) / steps
        ms = [first_ms / warmup] * warmup + [timed] * steps
    return {
        "step_ms_all": [round(x, 3) for x in ms],
        "step_ms_timed": ms[warmup:],
        "json_step_ms_mean_incl_warmup": rep["step_ms"],
        "parsed_mean_incl_warmup": statistics.fmean(ms),
        "wall_s": wall, "user_s": u1[0] - u0[0], "sys_s": u1[1] - u0[1], "minflt": u1[2] - u0[2],
        "last_loss": rep["loss"],
        "precision": planned,
        "measured_peak_bytes": rep.get("measured_peak_bytes"),
        "predicted_peak_bytes": rep.get("predicted_peak_bytes"),
        "host": rep.get("host_memory", {}),
        "load_1min": os.getloadavg()[0],
    }


def torch_rep(model, batch, steps, warmup, threads, precision, dropout):
    out, _, _ = run_child([PY, os.path.join(ROOT, "bench", "torch_train_step.py"), "--model", model, "--batch",
                           str(batch), "--threads", str(threads)] + ([] if dropout else ["--no-dropout"]) + ["--warmup", str(warmup),
                           "--runs", str(steps), "--onnx", VIT_B16_ONNX, "--data", VIT_B16_DATA,
                           "--precision", precision], env_for(threads))
    d = json.loads(out.strip().splitlines()[-1])
    if d["torch_num_threads"] != threads:
        raise SystemExit(f"torch ran with {d['torch_num_threads']} threads, wanted {threads}")
    if d.get("precision", "fp32") != precision:
        raise SystemExit(f"torch ran in {d.get('precision', 'fp32')}, wanted {precision}")
    return {"step_ms_timed": d["step_ms_all"], "last_loss": d["last_loss"], "torch_version": d["torch_version"],
            "precision": d.get("precision", "fp32"), "param_dtypes": d.get("param_dtypes"), "load_1min": os.getloadavg()[0]}


def prepare_vit_b_16(batch):
    """The skeleton with seeded random weights, and 3 batches of N(0,1) images (numpy seed 0), once."""
    if not os.path.exists(VIT_B16_ONNX):
        subprocess.run([PY, os.path.join(ROOT, "bench", "random_weights.py"),
                        os.path.join(ROOT, "models", "vit_b_16_skeleton.onnx"), VIT_B16_ONNX], check=True)
    if not os.path.exists(VIT_B16_DATA):
        import numpy as np
        rng = np.random.default_rng(0)
        n = 3 * batch
        np.savez(VIT_B16_DATA, x=rng.standard_normal((n, 3, 224, 224), dtype=np.float32),
                 y=rng.integers(0, 1000, n).astype(np.int64))


def summarize(reps):
    pooled = [x for r in reps for x in r["step_ms_timed"]]
    per_rep = [statistics.median(r["step_ms_timed"]) for r in reps]
    loads = [r["load_1min"] for r in reps]
    return {"median_ms": statistics.median(pooled), "rep_median_min": min(per_rep), "rep_median_max": max(per_rep),
            "n_steps": len(pooled), "load_min": min(loads), "load_max": max(loads)}


def main():
    global MEMC
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="vit_tiny,vit_small32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--precisions", default="fp32", help="comma list of fp32, bf16-mixed")
    ap.add_argument("--reps", type=int, default=5, help="processes per (model, threads, precision, framework)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per process")
    ap.add_argument("--warmup", type=int, default=3, help="untimed first steps per process")
    ap.add_argument("--json", help="write all raw figures here")
    ap.add_argument("--wait-policy", choices=("passive", "active"), help="OMP_WAIT_POLICY for both frameworks (default: each its own)")
    ap.add_argument("--baseline", help="another memc binary (an earlier build) run alongside, with plans it compiles itself: "
                                       "a third column, and memc's time against it")
    ap.add_argument("--dropout", action="store_true",
                    help="train with the exported dropout (p = 0.1) in both, not --no-dropout")
    args = ap.parse_args()
    global WAIT_POLICY
    WAIT_POLICY = args.wait_policy
    models = [m for m in args.models.split(",") if m]
    no_dropout = [] if args.dropout else ["--no-dropout"]  # memc compile's; torch_rep passes torch's
    threads = [int(t) for t in args.threads.split(",") if t]
    precisions = [p for p in args.precisions.split(",") if p]
    for p in precisions:
        if p not in PRECISIONS:
            raise SystemExit(f"--precisions: unknown '{p}' (one of {', '.join(PRECISIONS)})")
    if not precisions or len(set(precisions)) != len(precisions):
        raise SystemExit(f"--precisions: need one or more distinct precisions, got '{args.precisions}'")
    if not os.access(MEMC, os.X_OK):
        raise SystemExit(f"{MEMC} not built (cmake --build {ROOT}/build)")

    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "nproc": os.cpu_count(),
               "loadavg_start": os.getloadavg(), "args": vars(args), "cases": []}
    with tempfile.TemporaryDirectory(prefix="memc_bench_") as tmp:
        # private copy: build/memc may be relinked by other work while we measure
        private = os.path.join(tmp, "memc")
        shutil.copy2(MEMC, private)
        MEMC = private
        results["memc_binary"] = {"path": os.path.join(ROOT, "build", "memc"),
                                  "sha256": hashlib.sha256(open(private, "rb").read()).hexdigest()[:16]}
        baseline = None
        if args.baseline:
            baseline = os.path.join(tmp, "memc_baseline")
            shutil.copy2(args.baseline, baseline)
            results["baseline_binary"] = {"path": args.baseline,
                                          "sha256": hashlib.sha256(open(baseline, "rb").read()).hexdigest()[:16]}
        for model in models:
            batch = CASES[model]
            onnx_path = os.path.join(ROOT, "models", model + ".onnx")
            if model == "vit_tiny":
                data = os.path.join(ROOT, "data", "digits_train.npz")
            elif model == "vit_b_16":
                onnx_path, data = VIT_B16_ONNX, VIT_B16_DATA
                prepare_vit_b_16(batch)
            else:
                data = os.path.join(tmp, "small32.npz")
                n = batch * (args.steps + args.warmup + 1)
                subprocess.run([PY, os.path.join(ROOT, "bench", "torch_train_step.py"), "--write-data", data,
                                "--n", str(n)], check=True, stdout=subprocess.DEVNULL)
            plans, base_plans = {}, {}
            for prec in precisions:
                for t in threads:
                    # one plan per thread count: its kernel workspaces (oneDNN's scratchpads grow
                    # with threads) are sized for the threads it runs with, so measured = planned
                    # fp32 is memc's default: no --precision on its compile line
                    extra = [] if prec == "fp32" else ["--precision", prec]
                    for binary, where, tag in ((MEMC, plans, ""), (baseline, base_plans, ".baseline")):
                        if binary is None:
                            continue
                        where[(t, prec)] = os.path.join(tmp, f"{model}.{prec}.t{t}{tag}.plan")
                        subprocess.run([binary, "compile", onnx_path, "--batch", str(batch), "--optimizer", "adamw",
                                        "--epochs", "1000", "--threads", str(t)] + no_dropout + extra + ["-o", where[(t, prec)]],
                                       check=True, stdout=subprocess.DEVNULL)
            pairs = [(t, prec) for t in threads for prec in precisions]
            frameworks = ("memc", "torch") + (("baseline",) if baseline else ())
            raw = {tp: {fw: [] for fw in frameworks} for tp in pairs}
            for rep in range(args.reps):
                for t, prec in (pairs if rep % 2 == 0 else pairs[::-1]):
                    order = frameworks if rep % 2 == 0 else frameworks[::-1]
                    r = raw[(t, prec)]
                    for fw in order:
                        if fw == "memc":
                            r[fw].append(memc_rep(plans[(t, prec)], data, batch, args.steps, args.warmup, t, tmp, prec))
                        elif fw == "baseline":
                            r[fw].append(memc_rep(base_plans[(t, prec)], data, batch, args.steps, args.warmup, t, tmp, prec, baseline))
                        else:
                            r[fw].append(torch_rep(model, batch, args.steps, args.warmup, t, prec, args.dropout))
                    print(f"  {model} b{batch} T={t} {prec} rep {rep + 1}/{args.reps}: "
                          + ", ".join(f"{fw} {statistics.median(r[fw][-1]['step_ms_timed']):.2f} ms" for fw in frameworks)
                          + f", load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
            for t, prec in pairs:
                m, p = summarize(raw[(t, prec)]["memc"]), summarize(raw[(t, prec)]["torch"])
                case = {"model": model, "batch": batch, "threads": t, "precision": prec,
                        "memc": m, "torch": p, "ratio": m["median_ms"] / p["median_ms"], "raw": raw[(t, prec)]}
                if baseline:
                    b = summarize(raw[(t, prec)]["baseline"])
                    case["baseline"], case["memc_vs_baseline"] = b, m["median_ms"] / b["median_ms"]
                results["cases"].append(case)
    results["loadavg_end"] = os.getloadavg()

    print(f"nproc {results['nproc']}, load average at start {results['loadavg_start'][0]:.2f} "
          f"(1 min) / {results['loadavg_start'][1]:.2f} (5 min), at end {results['loadavg_end'][0]:.2f} / "
          f"{results['loadavg_end'][1]:.2f}; {args.reps} reps x {args.steps} timed steps after {args.warmup} warm-up")
    hdr = ("| model | batch | threads | precision | memc ms/step | (rep spread) | torch ms/step | (rep spread) "
           "| memc/torch |" + (" baseline ms/step | (rep spread) | memc/baseline |" if args.baseline else "") + " load (1 min) |")
    print(hdr)
    print("|---|---:|---:|---|---:|---|---:|---|---:|" + ("---:|---|---:|" if args.baseline else "") + "---|")
    for c in results["cases"]:
        m, p = c["memc"], c["torch"]
        base = ""
        if "baseline" in c:
            b = c["baseline"]
            base = (f" {b['median_ms']:.2f} | {b['rep_median_min']:.2f}–{b['rep_median_max']:.2f} | "
                    f"{c['memc_vs_baseline']:.2f} |")
        print(f"| {c['model']} | {c['batch']} | {c['threads']} | {c['precision']} | {m['median_ms']:.2f} | "
              f"{m['rep_median_min']:.2f}–{m['rep_median_max']:.2f} | {p['median_ms']:.2f} | "
              f"{p['rep_median_min']:.2f}–{p['rep_median_max']:.2f} | {c['ratio']:.2f} |{base} "
              f"{min(m['load_min'], p['load_min']):.1f}–{max(m['load_max'], p['load_max']):.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"raw figures: {args.json}")
    print(f"memc binary sha256 {results['memc_binary']['sha256']}…")


if __name__ == "__main__":
    main()
