"""alexnet at 224 px (bench/export_sweep/models_torchvision.py): why memc's first-step conv weight gradients differ
from float64 PyTorch. Finds the max-pool windows whose two largest inputs are within 1e-6 relative, routes them
to the runner-up in the float64 reference (raised by 1e-12), and compares memc's dumped gradients with both
references. Needs the sweep's outputs in /tmp/tv_sweep (models_torchvision.py --only alexnet_224, then
run_sweep.py alexnet_224); bench/journal/2026.md §53 has the result.

    python bench/export_sweep/torchvision_maxpool_tie.py
"""
import sys, json
sys.path.insert(0, "/work/main/bench/export_sweep")
import numpy as np, torch, torch.nn.functional as F
import models_torchvision as TV
E = TV.E
name = "alexnet_224"
i = list(TV.SPECS).index(name); seed = 10 + i
TV._cur["img"] = TV.SPECS[name][1]
E.seed_all(seed)
inner = TV.image_models()[name]()
E.make_unique_(inner, seed + 1000)
model = E.ImageLogits(inner).eval().double()
d = np.load(f"/tmp/tv_sweep/{name}_dynamo_noopt.data.npz")
x = torch.from_numpy(d["pixel_values"]).double()
feats = inner.m.features
h = x
for k, layer in enumerate(feats):
    if isinstance(layer, torch.nn.MaxPool2d):
        u = F.unfold(h, layer.kernel_size, stride=layer.stride)  # [B, C*9, L]
        B, CK, L = u.shape; C = CK // 9
        u = u.view(B, C, 9, L)
        top2 = u.topk(2, dim=2).values
        ties = ((top2[:, :, 0] == top2[:, :, 1]) & (top2[:, :, 0] > 0)).sum().item()
        zero_max = (top2[:, :, 0] == 0).sum().item()
        near = ((top2[:, :, 0] - top2[:, :, 1]).abs() < 1e-6 * top2[:, :, 0].abs().clamp_min(1e-30)) .sum().item()
        print(k, "maxpool windows", B * C * L, "positive ties", ties, "near ties", near, "all-zero windows", zero_max)
    h = layer(h)

# Route the one positive near-tie window of the last max pool to its runner-up, in float64, and
# compare memc's gradients with both references.
import copy
layer12 = feats[12]
def flip_hook(mod, inp):
    t = inp[0].clone()
    u = F.unfold(t.detach(), 3, stride=2); B, CK, L = u.shape; C = CK // 9
    u = u.view(B, C, 9, L); top = u.topk(2, dim=2)
    gap = (top.values[:, :, 0] - top.values[:, :, 1]).abs()
    cand = (gap < 1e-6 * top.values[:, :, 0].abs()) & (top.values[:, :, 0] > 0)
    idx = cand.nonzero()
    H = t.shape[2]; OW = (H - 3) // 2 + 1
    with torch.no_grad():
        for b, c, l in idx.tolist():
            k2 = top.indices[b, c, 1, l].item(); k1 = top.indices[b, c, 0, l].item()
            oy, ox = divmod(l, OW)
            y2, x2 = oy * 2 + k2 // 3, ox * 2 + k2 % 3
            y1, x1 = oy * 2 + k1 // 3, ox * 2 + k1 % 3
            print("flip window", b, c, l, float(t[b, c, y1, x1]), float(t[b, c, y2, x2]))
            t[b, c, y2, x2] = t[b, c, y1, x1] + 1e-12
    return (t,)
def grads2(flip):
    m = copy.deepcopy(model)
    if flip: m.inner.m.features[12].register_forward_pre_hook(flip_hook)
    out = m(x); out = out[0] if isinstance(out, tuple) else out
    F.cross_entropy(out, torch.from_numpy(d["y"])).backward()
    return {n: p.grad.numpy() for n, p in m.named_parameters()}
g0, g1 = grads2(False), grads2(True)
meta = json.load(open("/tmp/tv_sweep/alexnet_224_dynamo_noopt.meta.json"))
gm = np.load("/tmp/tv_sweep/alexnet_224_dynamo_noopt.grads.npz")
for init, ps in meta["map"].items():
    if init not in gm.files or len(ps) != 1 or "^T" in ps[0] or "weight" not in ps[0]: continue
    p = ps[0].replace("(reshaped)", "")
    a0 = g0[p].reshape(gm[init].shape); a1 = g1[p].reshape(gm[init].shape)
    den = np.abs(a0).max()
    print(p, f"memc vs f64 {np.abs(gm[init]-a0).max()/den:.1e}; memc vs f64 with the flip {np.abs(gm[init]-a1).max()/den:.1e}")
