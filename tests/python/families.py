"""Small random-init vision transformers of the families people bring (transformers' ViT, DeiT,
BEiT, Swin, Swinv2, ConvNeXt; torchvision's vit_b_16 and swin_t built small), each a module
from images [B, 3, 16, 16] to logits over 5 classes, with dropout where the family has it."""
import torch
from torch import nn

IMAGE, CLASSES = 16, 5


class Logits(nn.Module):
    """A transformers model whose forward returns its logits tensor."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(pixel_values=x).logits


def _hf(config_name, model_name, dropout, **kw):
    import transformers

    config = getattr(transformers, config_name)(image_size=IMAGE, num_channels=3, num_labels=CLASSES, **kw)
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        if hasattr(config, key):
            setattr(config, key, dropout)
    return Logits(getattr(transformers, model_name)(config))


def vit(dropout=0.0):
    return _hf("ViTConfig", "ViTForImageClassification", dropout, patch_size=4, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=64)


def deit(dropout=0.0):
    return _hf("DeiTConfig", "DeiTForImageClassification", dropout, patch_size=4, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=64)


def beit(dropout=0.0):
    return _hf("BeitConfig", "BeitForImageClassification", dropout, patch_size=4, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=64, use_relative_position_bias=True, use_mean_pooling=True, drop_path_rate=0.0)


def swin(dropout=0.0):
    return _hf("SwinConfig", "SwinForImageClassification", dropout, patch_size=2, embed_dim=16, depths=[2, 2],
               num_heads=[2, 2], window_size=2, drop_path_rate=0.0)


def swinv2(dropout=0.0):
    return _hf("Swinv2Config", "Swinv2ForImageClassification", dropout, patch_size=2, embed_dim=16, depths=[2, 2],
               num_heads=[2, 2], window_size=2, drop_path_rate=0.0)


def convnext(dropout=0.0):
    return _hf("ConvNextConfig", "ConvNextForImageClassification", dropout, patch_size=2, num_stages=2, hidden_sizes=[16, 32],
               depths=[1, 1], drop_path_rate=0.0)


def tv_vit(dropout=0.0):
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=IMAGE, patch_size=4, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                             dropout=dropout, attention_dropout=dropout, num_classes=CLASSES)


def tv_swin(dropout=0.0):
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer(patch_size=[2, 2], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[2, 2],
                           dropout=dropout, attention_dropout=dropout, stochastic_depth_prob=0.0, num_classes=CLASSES)


FAMILIES = {"vit": vit, "deit": deit, "beit": beit, "swin": swin, "swinv2": swinv2, "convnext": convnext,
            "torchvision_vit": tv_vit, "torchvision_swin": tv_swin}
