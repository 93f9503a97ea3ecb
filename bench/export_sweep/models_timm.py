"""timm 1.0.31 image classifiers as tiny random configs (pretrained=False), patched into export_all.py
(same pattern as models_round4.py): eval() exports with the four exporter settings, then run_sweep.py.

    SWEEP_OUT=/tmp/timm_sweep /tmp/timm-venv/bin/python bench/export_sweep/models_timm.py [--only NAME ...]
    SWEEP_OUT=/tmp/timm_sweep MEMC=$PWD/build/memc /tmp/timm-venv/bin/python bench/export_sweep/run_sweep.py   # an absolute path: it runs in SWEEP_OUT
    SWEEP_OUT=/tmp/timm_sweep /tmp/timm-venv/bin/python bench/export_sweep/models_timm.py --table   # make_table.py's tables
    /tmp/timm-venv/bin/python bench/export_sweep/models_timm.py --probe     # build + forward each, no export

Each family: (constructor taking extra timm kwargs, e.g. drop_rate / drop_path_rate, image size). The image
size is per model (32 where the family allows it, else 48 or 64): export_all's image_batch is patched to use it.
timm models take the image positionally and return the logits tensor; TimmLogits adapts that to
export_all's ImageLogits (which calls inner(pixel_values=..., return_dict=False)[0] and reads inner.config).
timm_train_sweep.py reuses SPECS for the train() exports."""
import os
import sys
import types

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_all as E  # noqa: E402

NC = 10  # classes (labels in export_all.image_batch are < 10)


def tm(name, **kw):
    """timm.create_model with a tiny override; extra kwargs (drop rates) are passed by the caller."""
    def make(**extra):
        import timm
        return timm.create_model(name, pretrained=False, num_classes=NC, **kw, **extra)
    return make


def cls(path, **kw):
    """a timm model class built directly (the entrypoint fixes the args we need to shrink)."""
    def make(**extra):
        import importlib
        mod, c = path.rsplit(".", 1)
        return getattr(importlib.import_module(mod), c)(num_classes=NC, **kw, **extra)
    return make


def poolformer(**extra):
    """poolformer_s12's settings (its entrypoint fixes depths/dims) with 1 block a stage."""
    import timm.models.metaformer as M
    return M.MetaFormer(num_classes=NC, depths=(1, 1, 1, 1), dims=(16, 24, 32, 48), downsample_norm=None,
                        mlp_act=nn.GELU, mlp_bias=True, norm_layers=M.GroupNorm1, layer_scale_init_values=1e-5,
                        res_scale_init_values=None, use_mlp_head=False, **extra)


VIT = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
# name -> (ctor(**extra timm kwargs), image size)
SPECS = {
    "vit": (tm("vit_tiny_patch16_224", **VIT), 32),
    "vit_reg": (tm("vit_tiny_patch16_224", reg_tokens=4, **VIT), 32),
    "deit_distilled": (tm("deit_tiny_distilled_patch16_224", **VIT), 32),
    "deit3": (tm("deit3_small_patch16_224", **VIT), 32),
    "flexivit": (tm("flexivit_small", **VIT), 32),
    "cait": (tm("cait_xxs24_224", img_size=32, patch_size=8, embed_dim=32, depth=2, depth_token_only=1,
                num_heads=2), 32),
    "beit": (tm("beit_base_patch16_224", **VIT), 32),
    "eva02": (tm("eva02_tiny_patch14_224", **VIT), 32),
    "swin": (tm("swin_tiny_patch4_window7_224", img_size=32, window_size=4, embed_dim=16, depths=(2, 2),
                num_heads=(2, 2)), 32),
    "swinv2": (tm("swinv2_tiny_window8_256", img_size=32, window_size=4, embed_dim=16, depths=(2, 2),
                  num_heads=(2, 2)), 32),
    "convnext": (tm("convnext_atto", depths=(1, 1, 1, 1), dims=(16, 24, 32, 48)), 32),
    "efficientnet": (tm("test_efficientnet"), 32),
    "mobilenetv3": (tm("mobilenetv3_small_050"), 32),
    "resnet": (tm("resnet18", layers=(1, 1, 1, 1)), 32),
    "regnet": (tm("regnetx_002"), 32),
    "levit": (tm("levit_128s", img_size=64), 64),
    "mixer": (cls("timm.models.mlp_mixer.MlpMixer", img_size=32, patch_size=8, num_blocks=2, embed_dim=32), 32),
    "convmixer": (cls("timm.models.convmixer.ConvMixer", dim=32, depth=2, kernel_size=3, patch_size=4), 32),
    "poolformer": (lambda **extra: poolformer(**extra), 32),
    "pvt_v2": (tm("pvt_v2_b0", depths=(1, 1, 1, 1)), 32),
    "twins_pcpvt": (tm("twins_pcpvt_small", img_size=32, depths=(1, 1, 1, 1), embed_dims=(16, 32, 48, 64),
                       num_heads=(1, 2, 2, 2)), 32),
    "twins_svt": (tm("twins_svt_small", img_size=64, depths=(1, 1, 1, 1), embed_dims=(16, 32, 48, 64),
                     num_heads=(1, 2, 2, 2), wss=(2, 2, 2, 2)), 64),
    "xcit": (tm("xcit_nano_12_p8_224", img_size=32, depth=2, embed_dim=32, num_heads=2), 32),
    "edgenext": (tm("edgenext_xx_small"), 64),
    "mobilevit": (tm("mobilevit_xxs"), 64),
    "coat_lite": (tm("coat_lite_tiny", img_size=32, embed_dims=(16, 32, 48, 64), serial_depths=(1, 1, 1, 1)), 32),
    "coatnet": (tm("test_coatnet", img_size=64), 64),
    "maxvit": (tm("test_maxvit", img_size=64), 64),
    "nest": (cls("timm.models.nest.Nest", img_size=32, patch_size=4, embed_dims=(16, 32, 48), num_heads=(1, 2, 2),
                depths=(1, 1, 1)), 32),
    "crossvit": (cls("timm.models.crossvit.CrossVit", img_size=48, img_scale=(1.0, 2 / 3), patch_size=(12, 16),
                     embed_dim=(24, 32),
                    depth=((1, 1, 0),), num_heads=(2, 2), mlp_ratio=(2, 2, 1)), 48),
    "ghostnet": (tm("ghostnet_050"), 32),
    "densenet": (cls("timm.models.densenet.DenseNet", growth_rate=8, block_config=(2, 2, 2, 2),
                     stem_type=""), 32),
}


def nofused(ctor):
    """the same model with timm's fused attention off (F.scaled_dot_product_attention -> explicit
    q@k^T, softmax, @v): the dynamo exporter fails on beit/maxvit/nest/twins_svt's fused path."""
    def make(**extra):
        m = ctor(**extra)
        for mod in m.modules():
            if hasattr(mod, "fused_attn"):
                mod.fused_attn = False
        return m
    return make


# appended after the first run (keeps the seeds of the list above): fused attention off
for _n in ("beit", "maxvit", "nest", "twins_svt", "vit"):
    SPECS[_n + "_nofused"] = (nofused(SPECS[_n][0]), SPECS[_n][1])


# ---- second batch (appended after the lists above had run: their seeds stay the same). Families chosen for
# ops the first batch lacks: weight standardization (StdConv / ScaledStdConv: BatchNorm in training mode on
# the weights, inside an eval() model), EvoNorm, GroupNorm, GRN, LSTM, fold/unfold, relative-position
# attention in CNNs, linear attention, reparameterizable branches, multi-resolution fusion, 'same' padding.
def resnetv2_bit(**extra):
    """BiT: ResNetV2 with StdConv2d (weight standardization) and GroupNorm, 1 block a stage, narrow."""
    from functools import partial
    from timm.layers import GroupNormAct, StdConv2d
    from timm.models.resnetv2 import ResNetV2
    return ResNetV2(layers=(1, 1, 1, 1), channels=(32, 64, 96, 128), num_classes=NC, stem_chs=16, stem_type="fixed",
                    conv_layer=partial(StdConv2d, eps=1e-8), norm_layer=partial(GroupNormAct, num_groups=8), **extra)


def caformer(**extra):
    """caformer_s18's layout (SepConv, SepConv, Attention, Attention; its MLP head), 1 block a stage."""
    import timm.models.metaformer as M
    return M.MetaFormer(num_classes=NC, depths=(1, 1, 1, 1), dims=(16, 24, 32, 64),
                        token_mixers=[M.SepConv, M.SepConv, M.Attention, M.Attention],
                        norm_layers=[M.LayerNorm2dNoBias] * 2 + [M.LayerNormNoBias] * 2, **extra)


def mvitv2(**extra):
    import timm.models.mvitv2 as MV
    return MV.MultiScaleVit(MV.MultiScaleVitCfg(depths=(1, 1, 1, 1), embed_dim=16, num_heads=1), img_size=64,
                            num_classes=NC, **extra)


SPECS2 = {
    "nfnet": (tm("test_nfnet"), 32),
    "resnetv2_bit": (resnetv2_bit, 32),
    "vit_hybrid": (tm("vit_tiny_r_s16_p8_224", img_size=64, embed_dim=32, depth=2, num_heads=2), 64),
    "efficientnet_evos": (tm("test_efficientnet_evos"), 32),
    "efficientnet_gn": (tm("test_efficientnet_gn"), 32),
    "efficientnet_ln": (tm("test_efficientnet_ln"), 32),
    "tf_efficientnet": (tm("tf_efficientnet_b0"), 32),
    "byobnet": (tm("test_byobnet"), 32),
    "vit_relpos": (tm("test_vit_relpos", img_size=32), 32),
    "vit_map": (tm("vit_tiny_patch16_224", global_pool="map", **VIT), 32),
    "mambaout": (tm("test_mambaout"), 32),
    "convnextv2": (tm("convnextv2_atto", depths=(1, 1, 1, 1), dims=(16, 24, 32, 48)), 32),
    "mixnet": (tm("mixnet_s"), 32),
    "regnety": (tm("regnety_002"), 32),
    "rexnet": (tm("rexnet_100"), 32),
    "mobileone": (tm("mobileone_s0"), 32),
    "repvit": (tm("repvit_m0_9"), 64),
    "fastvit": (tm("fastvit_sa12", layers=(1, 1, 1, 1)), 64),
    "efficientvit_mit": (tm("efficientvit_b0"), 64),
    "efficientvit_msra": (tm("efficientvit_m0", img_size=64), 64),
    "mobilenetv4_hybrid": (tm("mobilenetv4_hybrid_medium"), 64),
    "efficientformerv2": (tm("efficientformerv2_s0", img_size=64), 64),
    "ghostnetv2": (tm("ghostnetv2_100"), 64),
    "hrnet": (tm("hrnet_w18_small"), 64),
    "dla": (tm("dla46_c"), 32),
    "dpn": (tm("dpn48b"), 32),
    "sknet": (tm("skresnet18"), 32),
    "res2net": (tm("res2net50_14w_8s", layers=(1, 1, 1, 1)), 32),
    "botnet": (tm("botnet26t_256", img_size=64), 64),
    "lambda_resnet": (tm("lambda_resnet26t", img_size=64), 64),
    "sequencer": (cls("timm.models.sequencer.Sequencer2d", img_size=32, layers=(1, 1, 1, 1), patch_sizes=(4, 2, 1, 1),
                      embed_dims=(16, 32, 32, 32), hidden_sizes=(8, 16, 16, 16), mlp_ratios=(2, 2, 2, 2)), 32),
    "volo": (cls("timm.models.volo.VOLO", img_size=32, layers=(1, 1, 1, 1), embed_dims=(32, 64, 64, 64), num_heads=(1, 2, 2, 2),
                 stem_hidden_dim=16, downsamples=(True, False, False, False)), 32),
    "tnt": (cls("timm.models.tnt.TNT", img_size=32, patch_size=8, embed_dim=32, inner_dim=8, depth=2, num_heads_outer=2,
                num_heads_inner=1), 32),
    "pit": (tm("pit_ti_224", img_size=32, patch_size=8, stride=4), 32),
    "convit": (tm("convit_tiny", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, local_up_to_layer=1), 32),
    "gmlp": (cls("timm.models.mlp_mixer.MlpMixer", img_size=32, patch_size=8, num_blocks=2, embed_dim=32, mlp_ratio=6,
                 block_layer=__import__("timm.models.mlp_mixer", fromlist=["x"]).SpatialGatingBlock,
                 mlp_layer=__import__("timm.layers", fromlist=["x"]).GatedMlp), 32),
    "resmlp": (cls("timm.models.mlp_mixer.MlpMixer", img_size=32, patch_size=8, num_blocks=2, embed_dim=32, mlp_ratio=4,
                   block_layer=__import__("timm.models.mlp_mixer", fromlist=["x"]).ResBlock,
                   norm_layer=__import__("timm.models.mlp_mixer", fromlist=["x"]).Affine), 32),
    "gcvit": (tm("gcvit_xxtiny", img_size=64, window_size=(2, 2, 2, 2)), 64),
    "davit": (tm("davit_tiny", depths=(1, 1, 1, 1), embed_dims=(16, 32, 48, 64), num_heads=(1, 2, 2, 2), window_size=2), 64),
    "focalnet": (cls("timm.models.focalnet.FocalNet", depths=(1, 1, 1, 1), embed_dim=16), 32),
    "inception_next": (tm("inception_next_tiny", depths=(1, 1, 1, 1), dims=(16, 32, 48, 64)), 32),
    "caformer": (lambda **extra: caformer(**extra), 32),
    "hgnetv2": (tm("hgnetv2_b0"), 32),
    "starnet": (tm("starnet_s050"), 32),
    "hiera": (tm("hiera_tiny_224", img_size=64, embed_dim=16, num_heads=1, stages=(1, 1, 1, 1)), 64),
    "mvitv2": (lambda **extra: mvitv2(**extra), 64),
    "coat": (tm("coat_tiny", img_size=32, embed_dims=(32, 32, 32, 32), serial_depths=(1, 1, 1, 1), parallel_depth=1), 32),
    "vovnet": (tm("ese_vovnet19b_dw"), 32),
    "rdnet": (tm("rdnet_tiny"), 32),
    "tresnet": (tm("tresnet_m"), 64),
}
SPECS.update(SPECS2)
for _n in ("hiera", "vit_relpos"):  # the dynamo exporter fails on their fused attention too
    SPECS[_n + "_nofused"] = (nofused(SPECS[_n][0]), SPECS[_n][1])


class TimmLogits(nn.Module):
    """x -> logits, under export_all's HF-style calling convention (timm's and torchvision's models alike)."""

    def __init__(self, inner):
        super().__init__()
        self.m = inner
        self.config = types.SimpleNamespace()

    def forward(self, pixel_values, return_dict=False):
        return (self.m(pixel_values),)


# The model list export_all sweeps (use_specs) and the image size of the model being exported.
_cur = {"img": 32, "specs": {}}


def image_batch(seed, b=E.B):
    s = _cur["img"]
    rng = np.random.default_rng(seed)
    return ({"pixel_values": rng.standard_normal((b, 3, s, s)).astype(np.float32)},
            np.array([3, 1, 7, 0][:b], np.int64))


_do_one = E.do_one


def do_one(name, ctor, kind, exporter, seed):
    _cur["img"] = _cur["specs"][name][1]
    return _do_one(name, ctor, kind, exporter, seed)


def image_models():
    return {n: (lambda c=c: TimmLogits(c())) for n, (c, _) in _cur["specs"].items()}


def use_specs(specs):
    """Patches export_all to sweep `specs` ({name: (constructor, image size)}) instead of its own lists."""
    _cur["specs"] = specs
    E.text_models = lambda: {}
    E.image_models = image_models
    E.image_batch = image_batch
    E.do_one = do_one


def probe(specs):
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    for n, (c, s) in specs.items():
        if only and n not in only:
            continue
        try:
            torch.manual_seed(0)
            m = c().eval()
            with torch.no_grad():
                y = m(torch.randn(2, 3, s, s))
            print(f"{n:22s} ok params={sum(p.numel() for p in m.parameters()):9d} out={tuple(y.shape)}", flush=True)
        except Exception as e:
            print(f"{n:22s} FAIL {type(e).__name__}: {str(e)[:300]}", flush=True)


def table(specs):
    """make_table.py's tables over these models (its model order swapped for the specs')."""
    import re
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_table.py")
    src = re.sub(r"order = \[.*?\]\n", "order = ORDER\n", open(path).read(), count=1, flags=re.S)
    exec(compile(src, path, "exec"), {"ORDER": list(specs), "__name__": "__main__"})


def main(specs, announce):
    """--probe, --table, or the sweep (export_all.main) after `announce()` names the library's version."""
    use_specs(specs)
    if "--probe" in sys.argv:
        probe(specs)
    elif "--table" in sys.argv:
        table(specs)
    else:
        announce()
        E.main()


use_specs(SPECS)

if __name__ == "__main__":
    def announce():
        import timm
        print("timm", timm.__version__, flush=True)
    main(SPECS, announce)
