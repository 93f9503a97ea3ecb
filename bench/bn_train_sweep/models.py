"""The sweep's models (sweep.py): tiny configs of transformers 5.25 image classifiers with BatchNorm, and a plain CNN."""
import torch, torch.nn as nn
import transformers as T

DROP_KEYS = ("dropout", "drop_rate", "drop_path", "drop_connect", "dropout_rate")

def zero_dropout_cfg(cfg):
    for k, v in list(vars(cfg).items()):
        if any(s in k for s in ("dropout", "drop_")) and not k.startswith("_"):
            if isinstance(v, (list, tuple)):
                setattr(cfg, k, type(v)(type(e)(0) for e in v))
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                setattr(cfg, k, type(v)(0))
    return cfg

class SmallCNN(nn.Module):
    def __init__(self, num_labels=5):
        super().__init__()
        def blk(i, o, s):
            return nn.Sequential(nn.Conv2d(i, o, 3, s, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU())
        self.features = nn.Sequential(blk(3, 8, 1), blk(8, 16, 2), blk(16, 16, 1), blk(16, 32, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_labels)
    def forward(self, x):
        return self.fc(self.pool(self.features(x)).flatten(1))

def specs():
    """name -> (builder returning (model, is_hf), image size)"""
    S = {}
    S["Levit"] = (lambda: T.LevitForImageClassification(zero_dropout_cfg(T.LevitConfig(
        image_size=64, num_channels=3, kernel_size=3, stride=2, padding=1, patch_size=16,
        hidden_sizes=[32, 48, 64], num_attention_heads=[1, 2, 2], depths=[1, 1, 1], key_dim=[8, 8, 8],
        drop_path_rate=0, mlp_ratio=[2, 2, 2], attention_ratio=[2, 2, 2],
        down_ops=[["Subsample", 8, 32 // 8, 4, 2, 2], ["Subsample", 8, 48 // 8, 4, 2, 2]],
        num_labels=5))), 64)
    S["MobileViT"] = (lambda: T.MobileViTForImageClassification(zero_dropout_cfg(T.MobileViTConfig(
        num_channels=3, image_size=64, patch_size=2, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 48],
        num_attention_heads=2, mlp_ratio=2.0, expand_ratio=2.0, num_labels=5))), 64)
    S["MobileViTV2"] = (lambda: T.MobileViTV2ForImageClassification(zero_dropout_cfg(T.MobileViTV2Config(
        num_channels=3, image_size=64, patch_size=2, width_multiplier=0.25, n_attn_blocks=[1, 1, 1],
        base_attn_unit_dims=[16, 24, 32], mlp_ratio=2.0, num_labels=5))), 64)
    S["Cvt"] = (lambda: T.CvtForImageClassification(zero_dropout_cfg(T.CvtConfig(
        num_channels=3, patch_sizes=[7, 3, 3], patch_stride=[4, 2, 2], patch_padding=[2, 1, 1],
        embed_dim=[16, 32, 48], num_heads=[1, 2, 3], depth=[1, 2, 3], mlp_ratio=[2.0, 2.0, 2.0],
        attention_drop_rate=[0.0, 0.0, 0.0], drop_rate=[0.0, 0.0, 0.0], drop_path_rate=[0.0, 0.0, 0.0],
        qkv_bias=[True, True, True], cls_token=[False, False, True], qkv_projection_method=["dw_bn", "dw_bn", "dw_bn"],
        kernel_qkv=[3, 3, 3], padding_kv=[1, 1, 1], stride_kv=[2, 2, 2], padding_q=[1, 1, 1], stride_q=[1, 1, 1],
        num_labels=5))), 32)
    S["ResNet"] = (lambda: T.ResNetForImageClassification(zero_dropout_cfg(T.ResNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck",
        downsample_in_first_stage=False, num_labels=5))), 32)
    S["RegNet"] = (lambda: T.RegNetForImageClassification(zero_dropout_cfg(T.RegNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8,
        layer_type="y", num_labels=5))), 32)
    S["MobileNetV2"] = (lambda: T.MobileNetV2ForImageClassification(zero_dropout_cfg(T.MobileNetV2Config(
        num_channels=3, image_size=32, depth_multiplier=0.25, depth_divisible_by=8, min_depth=8,
        expand_ratio=2.0, output_stride=32, first_layer_is_expansion=True, finegrained_output=False,
        classifier_dropout_prob=0.0, num_labels=5))), 32)
    S["EfficientNet"] = (lambda: T.EfficientNetForImageClassification(zero_dropout_cfg(T.EfficientNetConfig(
        num_channels=3, image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320,
        dropout_rate=0.0, drop_connect_rate=0.0, num_labels=5))), 32)
    S["Bit"] = (lambda: T.BitForImageClassification(zero_dropout_cfg(T.BitConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="preactivation",
        global_padding=None, num_groups=4, drop_path_rate=0.0, num_labels=5))), 32)
    S["SmallCNN"] = (lambda: SmallCNN(5), 32)
    return S
