"""Small torch modules for the package's tests: a ViT (patch convolution, class token, position
embedding, pre-norm encoder layers, head) for 8x8 single-channel images, no dropout."""
import torch
from torch import nn


class TinyViT(nn.Module):
    def __init__(self, image=8, patch=2, hidden=32, heads=2, layers=2, mlp=64, classes=10):
        super().__init__()
        tokens = (image // patch) ** 2
        self.patch = nn.Conv2d(1, hidden, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, hidden) * 0.02)
        layer = nn.TransformerEncoderLayer(hidden, heads, mlp, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], dim=1) + self.pos
        return self.head(self.norm(self.encoder(t))[:, 0])
