#!/usr/bin/env python3
"""Peak resident memory of the demo's training run: memc against PyTorch eager, in one run.

    python3 bench/footprint_vs_torch.py                          # the demo's 40 epochs (1760 steps)
    python3 bench/footprint_vs_torch.py --epochs 2 --eval data/digits_test.npz --json /tmp/fp.json
    python3 bench/footprint_vs_torch.py --memc /path/to/memc --python /work/venv/bin/python --threads 1

What it measures, on this machine, each in its own child process:
  memc     `MEMC compile models/vit_tiny.onnx --batch 32 --optimizer adamw --lr 2e-3
            --schedule warmup-cosine --warmup-steps 100 --epochs E -o PLAN` (scripts/demo.sh),
           then `MEMC run PLAN --data data/digits_train.npz [--eval EVAL] --quiet --json R.json`.
           From R.json: predicted_peak_bytes (the planned arena), process_peak_rss_bytes (memc's
           own VmHWM), step_ms, loss, accuracy (with --eval), threads.
  torch    `import torch` alone (a child that does nothing else: the interpreter + torch floor).
  torch    PyTorch eager training of the same model: models/torch_train_reference.py's
           load_vit_tiny (export_models.build_vit_tiny, every parameter loaded by name from the
           vit_tiny.onnx initializers and asserted equal), dropout set back to the exported
           p = 0.1 (memc keeps the ONNX file's dropout unless --no-dropout, which this script
           passes to both sides), the same data (data/digits_train.npz) in memc's order
           (torch_train_reference.epoch_order: memc's seeded Fisher-Yates, last partial batch
           dropped), batch 32, torch.optim.AdamW with the betas/eps/weight decay read from
           memc's plan, lr set before each 1-based step t from the plan's schedule
           (torch_train_reference.lr_at, the formula of memc's runtime/plan.cc), E x (N // 32)
           steps, torch.set_num_threads(T) with T = memc's thread count (R.json host_memory.threads,
           or --threads for both). Step time = the step's wall time (lr set, batch gather,
           zero_grad, forward, cross-entropy, backward, step, loss read), as memc's step_ms
           (total step wall time / steps). Dropout masks differ (different RNGs), so the loss
           curves agree only statistically unless --no-dropout.

Peak RSS is read two ways for every child: os.wait4's ru_maxrss (what resource.getrusage(
RUSAGE_CHILDREN) would report for one child) and the child's own VmHWM from /proc/self/status
(memc's process_peak_rss_bytes; the torch children print theirs). ru_maxrss carries the
spawning parent's resident high-water mark across fork/exec, so this driver imports only the
standard library (its own VmHWM is recorded as driver_vmhwm_bytes: a floor for ru_maxrss);
VmHWM starts afresh at exec; the table's first row is VmHWM read by each process at the end of
its work (memc: when it writes R.json; torch: after training and evaluation). The second row,
ru_maxrss, also covers process exit: with PyTorch 2.15 (the CUDA wheel, on the CPU) RSS grows by
~120 MiB *during exit*, in the C library's exit handlers (the shared libraries' static
destructors), after all Python-level work: `import torch` then exit peaks at ~615 MiB against a
VmHWM of ~496 MiB just before (~496 MiB with os._exit). The torch training child's peak also
includes numpy, onnx and torchvision (needed to build the model and read the ONNX weights); its
VmHWM after those imports and after building model and data is reported too.

Prints the CPU model (/proc/cpuinfo), core and thread counts, the torch version, and a table;
--json OUT writes every figure (and both loss curves). The driver needs only python3; the torch
children run under --python (default /work/venv/bin/python when it exists: torch, torchvision,
onnx, numpy). A memc binary that fails to run (it may be being relinked) is retried after
--retry-wait seconds, up to --retries times.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from cpu_info import cpu_model  # bench/cpu_info.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2.0 ** 20


# ----------------------------------------------------------------------------- process facts

def proc_status(field, pid="self"):
    """A kB field of /proc/<pid>/status (VmHWM, VmRSS) in bytes, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None




def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def run_child(cmd, cwd=ROOT):
    """Runs cmd; returns rc, stdout, stderr, ru_maxrss of this child (bytes), wall seconds."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        try:
            p = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err)
        except OSError as e:   # missing or half-written binary ("Text file busy", exec format error)
            return -1, "", f"{cmd[0]}: {e}", None, 0.0
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (p.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                ru.ru_maxrss * 1024, wall)


def run_memc(cmd, retries, wait_s):
    """run_child for a memc command, retried while the binary fails (someone may be relinking it)."""
    for attempt in range(retries + 1):
        rc, out, err, maxrss, wall = run_child(cmd)
        if rc == 0:
            return out, err, maxrss, wall
        tail = (err.strip() or out.strip())[-600:]
        if attempt < retries:
            print(f"[{' '.join(cmd[:2])}] exit {rc}: {tail}\n  retrying in {wait_s:g} s "
                  f"({attempt + 1}/{retries})", file=sys.stderr, flush=True)
            time.sleep(wait_s)
    raise SystemExit(f"{' '.join(cmd)}\n  failed (exit {rc}) after {retries + 1} attempts: {tail}")


# ----------------------------------------------------------------------------- torch children

def child_import():
    t0 = time.perf_counter()
    import torch
    print(json.dumps({"vmhwm_bytes": proc_status("VmHWM"), "vmrss_bytes": proc_status("VmRSS"),
                      "import_s": time.perf_counter() - t0, "torch_version": torch.__version__}))


def child_train(cfg):
    rss = {"start": proc_status("VmHWM")}
    import numpy as np
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "models"))
    import torch_train_reference as R      # imports onnx, export_models (torchvision)
    import export_models as E
    rss["imports"] = proc_status("VmHWM")

    d = np.load(os.path.join(ROOT, cfg["data"]))
    x_all = torch.from_numpy(d["x"])
    y_all = torch.from_numpy(d["y"])
    model, info = R.load_vit_tiny(os.path.join(ROOT, cfg["model"]))   # sets every dropout p = 0
    if cfg["dropout"]:
        E.set_dropout(model, cfg["dropout_p"])                          # back to the exported p
    torch.use_deterministic_algorithms(False)   # export_models switches it on (and 2 threads)
    torch.set_num_threads(cfg["threads"])
    model.train()
    o, s = cfg["optimizer"], cfg["schedule"]
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"], betas=(o["beta1"], o["beta2"]),
                            eps=o["eps"], weight_decay=o["weight_decay"])
    n, B = x_all.shape[0], cfg["batch"]
    per_epoch = n // B
    total = cfg["epochs"] * per_epoch
    horizon = s.get("total_steps") or total
    rss["model_data"] = proc_status("VmHWM")

    losses, times = [], []
    t = 0
    t_loop = time.perf_counter()
    for e in range(cfg["epochs"]):
        order = R.epoch_order(n, cfg["seed"], e)     # outside the timed steps (memc shuffles once too)
        for b in range(per_epoch):
            t += 1
            t0 = time.perf_counter()
            lr = R.lr_at(s["kind"], s["lr"], t, horizon, s.get("warmup_steps", 0), s.get("min_lr", 0.0))
            for g in opt.param_groups:
                g["lr"] = lr
            ii = torch.tensor(order[b * B:(b + 1) * B])
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x_all[ii]), y_all[ii])
            loss.backward()
            opt.step()
            losses.append(float(loss))
            times.append((time.perf_counter() - t0) * 1e3)
    loop_s = time.perf_counter() - t_loop
    rss["trained"] = proc_status("VmHWM")

    accuracy = None
    if cfg.get("eval"):
        de = np.load(os.path.join(ROOT, cfg["eval"]))
        xe, ye = torch.from_numpy(de["x"]), torch.from_numpy(de["y"])
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, xe.shape[0], B):
                correct += int((model(xe[i:i + B]).argmax(1) == ye[i:i + B]).sum())
        accuracy = correct / xe.shape[0]
    rss["end"] = proc_status("VmHWM")
    print(json.dumps({
        "torch_version": torch.__version__, "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "steps": t, "batches_per_epoch": per_epoch, "schedule_horizon": horizon, "n_train": n,
        "step_ms": sum(times) / len(times) if times else None,
        "step_ms_median": statistics.median(times) if times else None,
        "step_ms_first3": [round(x, 3) for x in times[:3]],
        "loop_s": loop_s,
        "loss": losses[-1] if losses else None,
        "last_epoch_mean_loss": statistics.fmean(losses[-per_epoch:]) if losses else None,
        "accuracy": accuracy,
        "vmhwm_bytes": rss["end"], "vmhwm_after_bytes": rss,
        "params": info["param_elements"], "matched_params": info["matched_params"],
        "dropout": cfg["dropout_p"] if cfg["dropout"] else 0.0,
        "losses": losses,
    }))


# ----------------------------------------------------------------------------- driver

def fmt_mib(b):
    return "-" if b is None else f"{b / MIB:.1f} MiB"


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    venv_py = "/work/venv/bin/python"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memc", default=os.path.join(ROOT, "build", "memc"), help="memc binary (default build/memc)")
    ap.add_argument("--python", default=venv_py if os.path.exists(venv_py) else sys.executable,
                    help="interpreter with torch, torchvision, onnx, numpy for the torch children")
    ap.add_argument("--epochs", type=int, default=40, help="epochs, both sides (the demo: 40)")
    ap.add_argument("--eval", metavar="NPZ", help="evaluation data (e.g. data/digits_test.npz): accuracy on both sides")
    ap.add_argument("--threads", type=int, help="threads for both (default: memc's default, and torch the same)")
    ap.add_argument("--no-dropout", action="store_true", help="dropout off on both sides (memc compile --no-dropout)")
    ap.add_argument("--skip-torch", action="store_true", help="only the memc side")
    ap.add_argument("--json", metavar="OUT", help="write every figure here")
    ap.add_argument("--retries", type=int, default=3, help="memc attempts after a failure (default 3)")
    ap.add_argument("--retry-wait", type=float, default=60.0, help="seconds between memc attempts (default 60)")
    ap.add_argument("--child", choices=["import", "train"], help=argparse.SUPPRESS)
    ap.add_argument("--child-config", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child == "import":
        return child_import()
    if args.child == "train":
        return child_train(json.loads(args.child_config))

    model, data, batch = "models/vit_tiny.onnx", "data/digits_train.npz", 32
    memc = os.path.abspath(args.memc)
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip() or "?"
    except OSError:
        rev = "?"
    facts = {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "usable_cores": usable_cores(),
             "loadavg_1min_start": os.getloadavg()[0], "memc": memc, "memc_git_head": rev,
             "epochs": args.epochs, "batch": batch, "model": model, "data": data, "eval": args.eval,
             "dropout": not args.no_dropout}
    print(f"CPU: {facts['cpu_model']}; {facts['cpu_count']} cores ({facts['usable_cores']} usable); "
          f"load {facts['loadavg_1min_start']:.2f}; memc {rev} ({memc})", flush=True)

    tmp = tempfile.mkdtemp(prefix="footprint_")
    try:
        plan, rjson = os.path.join(tmp, "vit_tiny.plan"), os.path.join(tmp, "r.json")
        thr = ["--threads", str(args.threads)] if args.threads else []
        compile_cmd = [memc, "compile", model, "--batch", str(batch), "--optimizer", "adamw", "--lr", "2e-3",
                       "--schedule", "warmup-cosine", "--warmup-steps", "100", "--epochs", str(args.epochs),
                       "-o", plan] + (["--no-dropout"] if args.no_dropout else []) + thr
        run_cmd = [memc, "run", plan, "--data", data] + (["--eval", args.eval] if args.eval else []) + \
                  ["--quiet", "--json", rjson] + thr
        _, _, compile_rss, compile_s = run_memc(compile_cmd, args.retries, args.retry_wait)
        with open(plan) as f:
            p = json.load(f)
        _, _, run_rss, run_s = run_memc(run_cmd, args.retries, args.retry_wait)
        with open(rjson) as f:
            r = json.load(f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    hm = r.get("host_memory") or {}
    memc_threads = hm.get("threads") or args.threads
    losses = r.get("losses") or []
    bpe = (r.get("steps") or 0) // args.epochs or None
    mres = {"compile_cmd": " ".join(compile_cmd[1:]), "run_cmd": " ".join(run_cmd[1:]),
            "compile_ru_maxrss_bytes": compile_rss, "compile_wall_s": compile_s,
            "run_ru_maxrss_bytes": run_rss, "run_wall_s": run_s,
            "process_peak_rss_bytes": r.get("process_peak_rss_bytes"),
            "predicted_peak_bytes": r.get("predicted_peak_bytes"),
            "measured_peak_bytes": r.get("measured_peak_bytes"),
            "gemm_buffer_bytes": hm.get("gemm_buffer_bytes"),
            "step_ms": r.get("step_ms"), "steps": r.get("steps"), "loss": r.get("loss"),
            "last_epoch_mean_loss": statistics.fmean(losses[-bpe:]) if losses and bpe else None,
            "accuracy": r.get("accuracy"), "threads": memc_threads,
            "gemm_library": hm.get("gemm_library"), "memc_version": p.get("memc_version"),
            "optimizer": p.get("optimizer"), "schedule": p.get("schedule"), "losses": losses}

    tres, ires = None, None
    if not args.skip_torch:
        threads = args.threads or memc_threads or usable_cores()
        opt = dict({"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}, **(p.get("optimizer") or {}))
        sched = dict({"kind": "warmup-cosine", "lr": 2e-3, "warmup_steps": 100, "min_lr": 0.0},
                     **(p.get("schedule") or {}))
        cfg = {"model": model, "data": data, "eval": args.eval, "batch": batch, "epochs": args.epochs,
               "seed": 0, "threads": threads, "dropout": not args.no_dropout, "dropout_p": 0.1,
               "optimizer": opt, "schedule": sched}
        me = os.path.abspath(__file__)
        rc, out, err, imp_rss, imp_s = run_child([args.python, me, "--child", "import"])
        if rc != 0:
            raise SystemExit(f"import torch child failed (exit {rc}): {err.strip()[-800:]}")
        ires = dict(json.loads(out.strip().splitlines()[-1]), ru_maxrss_bytes=imp_rss, wall_s=imp_s)
        rc, out, err, tr_rss, tr_s = run_child([args.python, me, "--child", "train",
                                                "--child-config", json.dumps(cfg)])
        if rc != 0:
            raise SystemExit(f"torch training child failed (exit {rc}): {err.strip()[-1500:]}")
        tres = dict(json.loads(out.strip().splitlines()[-1]), ru_maxrss_bytes=tr_rss, wall_s=tr_s,
                    python=args.python)
        if mres["steps"] is not None and tres["steps"] != mres["steps"]:
            print(f"warning: steps differ, memc {mres['steps']} vs torch {tres['steps']}", file=sys.stderr)

    facts["driver_vmhwm_bytes"] = proc_status("VmHWM")
    facts["loadavg_1min_end"] = os.getloadavg()[0]
    tv = tres["torch_version"] if tres else "-"
    print(f"threads: memc {memc_threads} (gemm {hm.get('gemm_threads')}), torch "
          f"{tres['threads'] if tres else '-'} (interop {tres['interop_threads'] if tres else '-'}); "
          f"torch {tv} ({args.python}); {mres['gemm_library']}")
    print(f"vit_tiny, batch {batch}, AdamW lr 2e-3 warmup-cosine (100 warm-up steps), {args.epochs} epochs, "
          f"dropout {'0.1' if not args.no_dropout else 'off'}; driver VmHWM {fmt_mib(facts['driver_vmhwm_bytes'])}")
    T = tres or {}
    va = (T.get("vmhwm_after_bytes") or {})
    rows = [
        ("peak RSS, VmHWM at the end of its work", fmt_mib(mres["process_peak_rss_bytes"]), fmt_mib(T.get("vmhwm_bytes"))),
        ("peak RSS, whole life incl. exit (ru_maxrss)", fmt_mib(mres["run_ru_maxrss_bytes"]), fmt_mib(T.get("ru_maxrss_bytes"))),
        ("`import torch` alone: VmHWM after the import", "-", fmt_mib(ires["vmhwm_bytes"]) if ires else "-"),
        ("`import torch` alone: ru_maxrss incl. exit", "-", fmt_mib(ires["ru_maxrss_bytes"]) if ires else "-"),
        ("RSS after imports (+numpy, onnx, torchvision)", "-", fmt_mib(va.get("imports"))),
        ("RSS after model + data built", "-", fmt_mib(va.get("model_data"))),
        ("VmHWM at the end - `import torch` alone", "-",
         fmt_mib(T["vmhwm_bytes"] - ires["vmhwm_bytes"]) if tres else "-"),
        ("memc compile peak RSS (ru_maxrss)", fmt_mib(mres["compile_ru_maxrss_bytes"]), "-"),
        ("planned peak (predicted_peak_bytes)", fmt_mib(mres["predicted_peak_bytes"]), "-"),
        ("measured arena peak (measured_peak_bytes)", fmt_mib(mres["measured_peak_bytes"]), "-"),
        ("steps", fmt(mres["steps"], "d"), fmt(T.get("steps"), "d")),
        ("step time (mean), ms", fmt(mres["step_ms"], ".3f"), fmt(T.get("step_ms"), ".3f")),
        ("step time (median), ms", "-", fmt(T.get("step_ms_median"), ".3f")),
        ("final loss (last step)", fmt(mres["loss"], ".4f"), fmt(T.get("loss"), ".4f")),
        ("mean loss, last epoch", fmt(mres["last_epoch_mean_loss"], ".4f"), fmt(T.get("last_epoch_mean_loss"), ".4f")),
        ("test accuracy", fmt(mres["accuracy"] and 100 * mres["accuracy"], ".2f") + (" %" if mres["accuracy"] is not None else ""),
         fmt(T.get("accuracy") and 100 * T["accuracy"], ".2f") + (" %" if T.get("accuracy") is not None else "")),
        ("wall time of the training process, s", fmt(mres["run_wall_s"], ".1f"), fmt(T.get("wall_s"), ".1f")),
    ]
    w = max(len(a) for a, _, _ in rows)
    print(f"| {'':{w}} | {'memc':>12} | {'PyTorch ' + tv:>20} |")
    print(f"|{'-' * (w + 2)}|{'-' * 13}:|{'-' * 21}:|")
    for a, b, c in rows:
        print(f"| {a:{w}} | {b:>12} | {c:>20} |")
    if tres and mres["process_peak_rss_bytes"]:
        print(f"PyTorch / memc peak RSS (VmHWM): {T['vmhwm_bytes'] / mres['process_peak_rss_bytes']:.1f}x")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"facts": facts, "memc": mres, "torch_import": ires, "torch": tres}, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
