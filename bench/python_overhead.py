"""The Python path's step time against the CLI's on the same plan (issue 31: overhead <= 2 %).

    python bench/python_overhead.py [--model models/vit_tiny.onnx] [--batch 32] [--steps 400] [--reps 5]

Same plan file and data (data/digits_train.npz, or random 3x32x32 images with --image 32): `memc run PLAN --steps S` in a child process
(its report's step_ms: the step itself; loop_step_ms: with its batch's assembly) against `plan.fit(batches)` from Python over NumPy
batches (wall time per step: conversion, the session's checks, the step). Alternating runs; the
median of each. Also, within each Python run, the wall time against the steps' own run time
(session.last_step_ms, timed as the CLI's step_ms): the Python path's share, free of the
drift between runs. Prints the CPU model and the thread count.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np

import memc
from cpu_info import cpu_model  # bench/cpu_info.py

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))




def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=os.path.join(SRC, "models", "vit_tiny.onnx"))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--memc", default=os.path.join(SRC, "build", "memc"))
    parser.add_argument("--image", type=int, default=0, help="random 3xNxN images instead of the digits (vit_small32: 32)")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp()
    if args.image:
        rng = np.random.default_rng(0)
        data = os.path.join(scratch, "random.npz")
        np.savez(data, x=rng.standard_normal((16 * args.batch, 3, args.image, args.image), dtype=np.float32),
                 y=rng.integers(0, 10, 16 * args.batch))
    else:
        data = os.path.join(SRC, "data", "digits_train.npz")
    d = np.load(data)
    x, y = d["x"], d["y"]
    epochs = -(-args.steps // (len(y) // args.batch))
    with tempfile.TemporaryDirectory() as tmp:
        plan = memc.compile(args.model, batch=args.batch, optimizer="adamw", lr=1e-3, epochs=epochs, output=os.path.join(tmp, "p.plan"))
        batches = [(x[i:i + args.batch], y[i:i + args.batch]) for i in range(0, len(y) - args.batch + 1, args.batch)]
        cli_ms, cli_loop_ms, py_ms, py_run_ms = [], [], [], []
        for rep in range(args.reps):
            report = os.path.join(tmp, f"r{rep}.json")
            subprocess.run([args.memc, "run", plan.path, "--data", data, "--steps", str(args.steps), "--quiet", "--json", report, "--force"],
                           check=True, stdout=subprocess.DEVNULL)
            cli_report = json.load(open(report))
            cli_ms.append(cli_report["step_ms"])
            cli_loop_ms.append(cli_report["loop_step_ms"])
            fresh = memc.load_plan(plan.path)
            session = fresh.session(total_steps=epochs * len(batches))
            session.step({"x": batches[0][0], "y": batches[0][1]})  # the arena and weights, outside the timing
            run_ms = 0.0
            t0 = time.perf_counter()
            for s in range(args.steps - 1):
                xb, yb = batches[(s + 1) % len(batches)]
                session.step({"x": xb, "y": yb})
                run_ms += session.last_step_ms
            wall_ms = 1000 * (time.perf_counter() - t0)
            py_ms.append(wall_ms / (args.steps - 1))
            py_run_ms.append(run_ms / (args.steps - 1))
    cli, py = statistics.median(cli_ms), statistics.median(py_ms)
    print(f"CPU {cpu_model()}, {os.cpu_count()} cores; {os.path.basename(args.model)} b{args.batch} AdamW fp32, {args.steps} steps x {args.reps}")
    print(f"CLI    step_ms {cli:.3f}  (runs: {', '.join(f'{v:.3f}' for v in cli_ms)})")
    print(f"Python step_ms {py:.3f}  (runs: {', '.join(f'{v:.3f}' for v in py_ms)})")
    print(f"Python / CLI   {py / cli:.4f} (medians); paired runs, median of the ratios "
          f"{statistics.median(p / c for p, c in zip(py_ms, cli_ms)):.4f}")
    cli_loop = statistics.median(cli_loop_ms)
    print(f"CLI    loop_step_ms {cli_loop:.3f} (the step with its batch's assembly and copy in: the span Python's wall time covers); "
          f"Python / CLI {py / cli_loop:.4f}, paired {statistics.median(p / c for p, c in zip(py_ms, cli_loop_ms)):.4f}")
    # In the same process and steps, so free of run-to-run drift: what the Python path adds to
    # the step memc runs (the CLI's step_ms times the same span).
    added = [w / r - 1 for w, r in zip(py_ms, py_run_ms)]
    print(f"Python's steps: wall {py:.3f} ms, of which memc's step {statistics.median(py_run_ms):.3f} ms; "
          f"added by the Python path {100 * statistics.median(added):+.2f} % (runs: {', '.join(f'{100 * a:+.2f}' for a in added)})")


if __name__ == "__main__":
    main()
