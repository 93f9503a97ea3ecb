"""torchvision classification models (weights=None, num_classes=10), shrunk where the constructors allow,
patched into export_all.py (models_timm.py's machinery): eval() exports with the four exporter settings,
then run_sweep.py.

    SWEEP_OUT=/tmp/tv_sweep nice -n 19 /tmp/timm-venv/bin/python bench/export_sweep/models_torchvision.py [--only NAME ...]
    SWEEP_OUT=/tmp/tv_sweep MEMC=/work/main/build/memc nice -n 19 /tmp/timm-venv/bin/python bench/export_sweep/run_sweep.py
    SWEEP_OUT=/tmp/tv_sweep /tmp/timm-venv/bin/python bench/export_sweep/models_torchvision.py --table
    /tmp/timm-venv/bin/python bench/export_sweep/models_torchvision.py --probe     # build + forward each, no export

Each entry: (constructor, image size). Names with a '_small' tail are the torchvision class with fewer
blocks / narrower layers (or a narrower classifier head) than the named variant."""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_all as E  # noqa: E402,F401  (TV.E: torchvision_maxpool_tie.py)
import models_timm as MT  # noqa: E402

NC = 10


def tv(name, **kw):
    def make():
        import torchvision.models as M
        return getattr(M, name)(weights=None, num_classes=NC, **kw)
    return make


def small_head(name, feat, **kw):
    """torchvision model with its 4096-wide classifier replaced by the same layers 64 wide."""
    def make():
        import torchvision.models as M
        m = getattr(M, name)(weights=None, num_classes=NC, **kw)
        m.classifier = nn.Sequential(nn.Dropout(0.5), nn.Linear(feat, 64), nn.ReLU(inplace=True), nn.Dropout(0.5),
                                     nn.Linear(64, 64), nn.ReLU(inplace=True), nn.Linear(64, NC)) if name == "alexnet" \
            else nn.Sequential(nn.Linear(feat, 64), nn.ReLU(True), nn.Dropout(0.5), nn.Linear(64, 64), nn.ReLU(True),
                               nn.Dropout(0.5), nn.Linear(64, NC))
        return m
    return make


def resnet_small(block, **kw):
    def make():
        from torchvision.models import resnet as R
        return R.ResNet(getattr(R, block), [1, 1, 1, 1], num_classes=NC, **kw)
    return make


def densenet_small():
    from torchvision.models.densenet import DenseNet
    return DenseNet(growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16, bn_size=2, num_classes=NC)


def convnext_small():
    from torchvision.models.convnext import ConvNeXt, CNBlockConfig
    return ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, 48, 1), CNBlockConfig(48, 64, 1),
                     CNBlockConfig(64, None, 1)], stochastic_depth_prob=0.0, num_classes=NC)


def swin_small(v2=False):
    def make():
        from torchvision.models import swin_transformer as S
        kw = dict(block=S.SwinTransformerBlockV2, downsample_layer=S.PatchMergingV2) if v2 else {}
        return S.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[4, 4],
                                 stochastic_depth_prob=0.0, num_classes=NC, **kw)
    return make


def maxvit_small():
    from torchvision.models.maxvit import MaxVit
    return MaxVit(input_size=(64, 64), stem_channels=16, partition_size=2, block_channels=[16, 32],
                  block_layers=[1, 1], head_dim=8, stochastic_depth_prob=0.0, num_classes=NC)


def vit_small():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                             num_classes=NC)


def effv2_small():
    from torchvision.models.efficientnet import EfficientNet, FusedMBConvConfig, MBConvConfig
    s = [FusedMBConvConfig(1, 3, 1, 16, 16, 1), FusedMBConvConfig(4, 3, 2, 16, 24, 1),
         MBConvConfig(4, 3, 2, 24, 32, 1), MBConvConfig(6, 3, 2, 32, 48, 1)]
    return EfficientNet(s, dropout=0.2, stochastic_depth_prob=0.0, num_classes=NC, last_channel=128,
                        norm_layer=lambda c: nn.BatchNorm2d(c, eps=1e-3))


SPECS = {
    "resnet18": (tv("resnet18"), 32),
    "resnext_small": (resnet_small("Bottleneck", groups=32, width_per_group=4), 32),  # resnext50_32x4d, 1 block/stage
    "wide_resnet_small": (resnet_small("Bottleneck", width_per_group=128), 32),  # wide_resnet50_2, 1 block/stage
    "vgg11_bn": (small_head("vgg11_bn", 512 * 7 * 7), 32),
    "alexnet": (small_head("alexnet", 256 * 6 * 6), 64),
    "squeezenet1_1": (tv("squeezenet1_1"), 64),
    "shufflenet_v2_x0_5": (tv("shufflenet_v2_x0_5"), 32),
    "mobilenet_v2": (tv("mobilenet_v2", width_mult=0.5), 32),
    "mobilenet_v3_small": (tv("mobilenet_v3_small"), 32),
    "mnasnet0_5": (tv("mnasnet0_5"), 32),
    "efficientnet_b0": (tv("efficientnet_b0"), 32),
    "efficientnet_v2_small": (effv2_small, 32),
    "regnet_y_400mf": (tv("regnet_y_400mf"), 32),
    "densenet_small": (densenet_small, 32),
    "googlenet": (tv("googlenet", aux_logits=False, init_weights=True), 64),
    "inception_v3": (tv("inception_v3", aux_logits=False, init_weights=True), 80),
    "convnext_small": (convnext_small, 32),
    "swin_t_small": (swin_small(False), 32),
    "swin_v2_t_small": (swin_small(True), 32),
    "maxvit_small": (maxvit_small, 64),
    "vit_small": (vit_small, 32),
}
# appended after the first run (keeps the seeds above): the full-size variants and more members of each family
SPECS.update({
    "alexnet_224": (small_head("alexnet", 256 * 6 * 6), 224),  # TorchScript needs 6x6 before the adaptive pool
    "swin_t": (tv("swin_t"), 32),  # 8x8 tokens, window 7: padded shifted windows
    "swin_v2_t": (tv("swin_v2_t"), 32),
    "convnext_tiny": (tv("convnext_tiny"), 32),
    "densenet121": (tv("densenet121"), 32),
    "efficientnet_v2_s": (tv("efficientnet_v2_s"), 32),
    "resnext50_32x4d": (tv("resnext50_32x4d"), 32),
    "mobilenet_v3_large": (tv("mobilenet_v3_large"), 32),
    "shufflenet_v2_x1_0": (tv("shufflenet_v2_x1_0"), 32),
    "squeezenet1_0": (tv("squeezenet1_0"), 64),
    "regnet_x_400mf": (tv("regnet_x_400mf"), 32),
    "googlenet_tin": (tv("googlenet", aux_logits=False, init_weights=True, transform_input=True), 64),
    "inception_v3_tin": (tv("inception_v3", aux_logits=False, init_weights=True, transform_input=True), 80),
    "wide_resnet50_2": (tv("wide_resnet50_2"), 32),
})


# The export_all patching, the per-model image size, --probe and --table: models_timm.py's.
_cur = MT._cur
image_models = MT.image_models
MT.use_specs(SPECS)


if __name__ == "__main__":
    def announce():
        import torchvision
        print("torchvision", torchvision.__version__, flush=True)
        torch.set_num_threads(2)
    MT.main(SPECS, announce)
