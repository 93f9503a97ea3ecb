"""BatchNorm-in-train() sweep (bench/journal/2026.md §49): memc beside PyTorch on tiny transformers
5.25 image classifiers with BatchNorm (LeViT, MobileViT, MobileViTV2, CvT, ResNet, RegNet,
MobileNetV2, EfficientNet; BiT for its GroupNorm) and a plain Conv-BN-ReLU CNN, in train(), through
memc.compile with each exporter: 4 SGD steps on the same batches, then the losses, every weight,
the running statistics and num_batches_tracked, and eval() predictions, against PyTorch (and a
float64 PyTorch run as the control of what float32 rounding alone does).

    build/python-test-venv/bin/python bench/bn_train_sweep/sweep.py [model ...]   # ~2 min on 2 cores

Rows go to $BN_SWEEP_OUT (default /tmp/bnsweep/results.jsonl): appended for named models, rewritten
for all."""
import copy, json, os, sys, time, traceback, warnings
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F
import memc
import models

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))
from families import Logits  # noqa: E402  a transformers model whose forward returns its logits

torch.set_num_threads(2)
warnings.filterwarnings("ignore")
OUT = os.environ.get("BN_SWEEP_OUT", "/tmp/bnsweep/results.jsonl")
EXPORTERS = ["dynamo", "torchscript"]
BN = nn.modules.batchnorm._BatchNorm


def logits_of(out):
    return out.logits if hasattr(out, "logits") else out


def rel(a, b):
    a = torch.as_tensor(np.asarray(a) if not torch.is_tensor(a) else a).double()
    b = torch.as_tensor(np.asarray(b) if not torch.is_tensor(b) else b).double()
    if a.shape != b.shape:
        return float("inf")
    d = (a - b).abs().max().item() if a.numel() else 0.0
    s = b.abs().max().item() if b.numel() else 0.0
    return d / s if s > 0 else d


def global_rel(pairs):
    """max|a-b| over all tensors / max|b| over all tensors (robust to tensors whose values are ~0)."""
    if not pairs:
        return 0.0, 0.0
    d = max((a.double() - b.double()).abs().max().item() for a, b in pairs)
    sc = max(b.double().abs().max().item() for a, b in pairs)
    return d / sc if sc > 0 else d, d


def step1_check(name, exporter, wrap, H, data):
    """A fresh plan and reference, one step only: params (relative to the update size), stats, predict."""
    m, _ = build(name)
    if wrap and hasattr(m, "config"):
        m = Logits(m)
    m.train()
    ref = copy.deepcopy(m)
    x, y = data[0]
    plan = memc.compile(m, (x,), optimizer="sgd", lr=0.05, exporter=exporter, epochs=4)
    plan.step(x, y)
    init = {k: p.detach().clone() for k, p in ref.named_parameters()}
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    F.cross_entropy(logits_of(ref(x)), y).backward()
    opt.step()
    st = plan.state_dict()
    # |a-b| / max|update| per parameter, over parameters whose update is above float noise (1e-6 of the weight scale)
    upd_errs = {}
    for k, p in ref.named_parameters():
        u = (p.detach() - init[k]).abs().max().item()
        if u > 1e-6 * max(init[k].abs().max().item(), 1e-3):
            upd_errs[k] = (st[k].double() - p.detach().double()).abs().max().item() / u
    sd = ref.state_dict()
    stats = {k: rel(st[k], v) for k, v in sd.items() if k.endswith(("running_mean", "running_var"))}
    ref.eval()
    with torch.no_grad():
        pr = rel(plan.predict(x), logits_of(ref(x)))
    w = max(upd_errs.items(), key=lambda kv: kv[1]) if upd_errs else (None, 0.0)
    return dict(step1_update_rel=w[1], step1_worst_update=w[0], step1_stat_rel=max(stats.values() or [0.0]), step1_predict_rel=pr)


def f64_control(m, data):
    """PyTorch's own trajectory in float64 from the same start: how sensitive the 4 steps are to rounding."""
    r = copy.deepcopy(m).double()
    opt = torch.optim.SGD(r.parameters(), lr=0.05)
    out = []
    for x, y in data:
        opt.zero_grad()
        loss = F.cross_entropy(logits_of(r(x.double())), y)
        loss.backward()
        opt.step()
        out.append(float(loss))
    return out


def build(name):
    builder, H = models.specs()[name]
    torch.manual_seed(0)
    m = builder()
    m.train()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, BN) and mod.track_running_stats:
                mod.running_mean.copy_(0.1 * torch.randn(mod.running_mean.shape, generator=g))
                mod.running_var.copy_(0.5 + torch.rand(mod.running_var.shape, generator=g))
    return m, H


def batches(H):
    g = torch.Generator().manual_seed(1234)
    return [(torch.randn(4, 3, H, H, generator=g), torch.randint(0, 5, (4,), generator=g)) for _ in range(4)]


def one(name, exporter, wrap):
    m, H = build(name)
    is_hf = hasattr(m, "config")
    if wrap and is_hf:
        m = Logits(m)
    m.train()
    nbn = sum(isinstance(x, BN) for x in m.modules())
    f64_losses = f64_control(m, batches(H))
    reference = copy.deepcopy(m)
    init_state = {k: v.clone() for k, v in reference.state_dict().items()}
    data = batches(H)
    x0 = data[0][0]
    plan = memc.compile(m, (x0,), optimizer="sgd", lr=0.05, exporter=exporter, epochs=4)
    opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    memc_losses, torch_losses = [], []
    for x, y in data:
        memc_losses.append(float(plan.step(x, y)))
        opt.zero_grad()
        loss = F.cross_entropy(logits_of(reference(x)), y)
        loss.backward()
        opt.step()
        torch_losses.append(float(loss))
    state = plan.state_dict()
    ref_state = reference.state_dict()
    stat_errs = {k: rel(state[k], v) for k, v in ref_state.items()
                 if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    param_errs = {k: rel(state[k], p.detach()) for k, p in reference.named_parameters()}
    missing = [k for k in ref_state if k not in state]
    # controls: how far the stats moved from their start, and how far eval() logits are from train() logits
    stat_moved = max([rel(init_state[k], ref_state[k]) for k in stat_errs if not k.endswith("num_batches_tracked")] or [0.0])
    with torch.no_grad():  # on a copy: a train() forward would update the reference's running stats
        train_pred = logits_of(copy.deepcopy(reference)(x0))
    reference.eval()
    with torch.no_grad():
        ref_pred = logits_of(reference(x0))
    pred = plan.predict(x0)
    worst = lambda d: max(d.items(), key=lambda kv: kv[1]) if d else (None, 0.0)
    ws, wp = worst(stat_errs), worst(param_errs)
    p_glob, p_abs = global_rel([(state[k], p.detach()) for k, p in reference.named_parameters()])
    m_glob, m_abs = global_rel([(state[k], v) for k, v in ref_state.items() if k.endswith("running_mean")])
    v_glob, v_abs = global_rel([(state[k], v) for k, v in ref_state.items() if k.endswith("running_var")])
    nbt_ok = all(int(state[k]) == int(v) for k, v in ref_state.items() if k.endswith("num_batches_tracked"))
    return dict(
        nbn=nbn, exporter_used=plan.summary.get("exporter"), wrapped=bool(wrap and is_hf),
        loss_rel=max(abs(a - b) / abs(b) for a, b in zip(memc_losses, torch_losses)),
        memc_losses=memc_losses, torch_losses=torch_losses,
        stat_rel=ws[1], worst_stat=ws[0], param_rel=wp[1], worst_param=wp[0],
        param_rel_global=p_glob, param_abs=p_abs, mean_rel_global=m_glob, mean_abs=m_abs, var_rel_global=v_glob, var_abs=v_abs,
        num_batches_tracked_equal=nbt_ok, f64_losses=f64_losses,
        control_f32_vs_f64_loss_rel=max(abs(a - b) / abs(b) for a, b in zip(torch_losses, f64_losses)),
        memc_vs_f64_loss_rel=max(abs(a - b) / abs(b) for a, b in zip(memc_losses, f64_losses)),
        **step1_check(name, exporter, wrap, H, data),
        predict_rel=rel(pred, ref_pred), control_stat_moved=stat_moved, control_train_vs_eval=rel(train_pred, ref_pred), n_stats=len(stat_errs), n_params=len(param_errs), missing=missing,
        num_batches_tracked=[int(state[k]) for k in ref_state if k.endswith("num_batches_tracked")][:1],
    )


def main():
    names = sys.argv[1:] or list(models.specs())
    mode = "a" if sys.argv[1:] else "w"
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, mode) as f:
        for name in names:
            for exporter in EXPORTERS:
                t0 = time.time()
                row = dict(model=name, exporter=exporter)
                raw_error = None
                try:
                    try:
                        row.update(one(name, exporter, wrap=False))
                    except Exception as e:  # HF output object: retry with the logits wrapper
                        if name == "SmallCNN":
                            raise
                        raw_error = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
                        row.update(one(name, exporter, wrap=True))
                    row["status"] = "ok"
                except memc.MemcError as e:
                    row["status"] = "refused"
                    row["error"] = " ".join(str(e).split())
                except Exception as e:
                    row["status"] = "error"
                    row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:600]}"
                    row["trace"] = traceback.format_exc(limit=-4)[-1500:]
                if raw_error:
                    row["raw_error"] = raw_error
                row["seconds"] = round(time.time() - t0, 1)
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(json.dumps({k: row.get(k) for k in ("model", "exporter", "status", "loss_rel", "stat_rel", "param_rel", "predict_rel", "nbn", "error", "seconds")}), flush=True)


if __name__ == "__main__":
    main()
