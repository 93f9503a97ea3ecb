import json, glob, os
OUT = os.environ.get("SWEEP_OUT", os.path.abspath("export_sweep_out"))
order = ["bert","roberta","xlm_roberta","distilbert","albert","electra","deberta_v2","mpnet","bigbird_full","bigbird_sparse",
         "gpt2","llama","qwen2","mistral","phi3","gemma","qwen3","modernbert","opt","vit","deit","beit","swin","convnext","mobilevit","dinov2"]
def row(model, exp):
    b = f"{model}_{exp}"
    meta = json.load(open(f"{OUT}/{b}.meta.json"))
    if meta.get("status") != "exported":
        e = (meta.get("export_errors") or [meta.get("error")])[-1]
        return f"| {model} | {exp} | export failed (torch) | – | – | – | – | – | – |"
    r = json.load(open(f"{OUT}/{b}.memc.json"))
    ok = lambda s: ("yes" if r.get(s, {}).get("rc") == 0 else (f"**no** (rc {r[s]['rc']})" if s in r else "–"))
    L = r.get("losses")
    train = f"yes ({L[0]:.3f}→{L[-1]:.3f})" if L and r.get("run_status") == "ok" else ok("run") if "run" in r else "–"
    loss = f"{L[0]:.6f} / {meta['torch_loss']:.6f}" if L else f"– / {meta['torch_loss']:.6f}"
    gw = r.get("grad_worst")
    g = f"{gw[1]:.1e} ({r['grad_n_compared']} tensors)" if gw else "–"
    if gw and gw[1] > 1e-3:
        g = f"**{gw[1]:.2f}** ({gw[0]})"
    lg = f"{r['logits_rel']:.1e}" if isinstance(r.get("logits_rel"), float) else "–"
    l2 = f"{r['logits2_rel']:.1e}" if isinstance(r.get("logits2_rel"), float) else (f"refused (rc {r['infer2']['rc']})" if r.get("infer2", {}).get("rc") not in (0, None) else "–")
    extra = [n for n in r.get("grad_extra", []) if n != "loss"]
    note = []
    if r.get("memc_trains_buffers"): note.append("buffer " + ",".join(x.split(".")[-1] for x in r["memc_trains_buffers"]) + " needs --freeze")
    if extra: note.append(f"{len(extra)} trained tensors not comparable (folded)")
    return f"| {model} | {exp} ({meta.get('dynamic')}) | {ok('inspect')} | {ok('compile')} | {train} | {loss} | {g} | {lg} / {l2} | {'; '.join(note)} |"
hdr = ("| model | exporter (dynamic axes) | inspect ok | compile ok | train ok (5 steps, loss first→last) | first-step loss memc / torch "
       "| worst grad rel. err | logits rel. err b4s16 / b3s12 | note |\n|---|---|---|---|---|---|---|---|---|")
for title, exps in [("Main sweep: torch.onnx.export defaults (dynamo=True, optimize=True) and TorchScript (dynamo=False, opset 17, defaults)", ["dynamo", "ts"]),
                    ("Variants: dynamo with optimize=False (what memc's Python package uses) and TorchScript with do_constant_folding=False", ["dynamo_noopt", "ts_nofold"])]:
    print(f"### {title}\n\n{hdr}")
    for m in order:
        for e in exps:
            print(row(m, e))
    print()

# second metric: tensors whose reference gradient is not ~0 (max|ref| >= 1e-3 of the largest)
import numpy as np
print("### Worst gradient rel. error over tensors with a non-negligible reference gradient (max|g| >= 1e-3 x the largest), plain max|Δ|/max|ref|\n")
print("| export | worst rel. err | tensor | tensors ~0 in PyTorch (max abs diff / global max) |\n|---|---|---|---|")
for f in sorted(glob.glob(f"{OUT}/*.grads.npz")):
    b = os.path.basename(f)[:-10]
    g, r = np.load(f), np.load(f"{OUT}/{b}.ref.npz")
    ks = [k[5:] for k in r.files if k.startswith("grad/") and k[5:] in g.files]
    gmax = max(float(np.abs(r["grad/" + k]).max()) for k in ks)
    big = {k: float(np.abs(g[k] - r["grad/" + k]).max() / np.abs(r["grad/" + k]).max()) for k in ks if np.abs(r["grad/" + k]).max() >= 1e-3 * gmax}
    small = [k for k in ks if k not in big]
    sm = max((float(np.abs(g[k] - r["grad/" + k]).max()) for k in small), default=0.0) / gmax
    w = max(big, key=big.get)
    print(f"| {b} | {big[w]:.1e} | {w} | {len(small)}: {sm:.1e} |")
