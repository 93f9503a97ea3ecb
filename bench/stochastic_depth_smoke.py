"""Stochastic depth in train() exports (bench/journal/2026.md §50): transformers' Swin, Swinv2, BEiT,
Dinov2 (whose mask token the output does not use without a mask) and ConvNeXt with drop-path rate
0.3 (DropPath: floor(rand + keep)), and LeViT's residual layers (rand().ge_(rate)), through
memc.compile with each exporter. Before any step memc's predictions equal PyTorch's eval(), where
the draws are the identity; four AdamW steps then train (losses printed: the draws differ from
PyTorch's, so steps are not compared here; tests/python/test_families.py::
test_stochastic_depth_trains_as_in_pytorch checks each draw's step).

    build/python-test-venv/bin/python bench/stochastic_depth_smoke.py [swin swinv2 beit dinov2 levit convnext]
"""
import sys, copy, torch, numpy as np, warnings
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__import__("os").path.abspath(__file__)), "..", "tests", "python"))
warnings.filterwarnings("ignore")
import memc, families
torch.manual_seed(0)
import transformers as T
def hf(cfg, cls, **kw):
    c = getattr(T, cfg)(image_size=16, num_channels=3, num_labels=families.CLASSES, **kw)
    return families.Logits(getattr(T, cls)(c))
def levit():  # LevitResidualLayer: rand(N, 1, 1).ge_(drop_rate); the config types the rate as int
    c = T.LevitConfig(image_size=64, num_channels=3, num_labels=families.CLASSES, hidden_sizes=[16, 32], num_attention_heads=[2, 2],
                      depths=[1, 1], key_dim=[4, 4], mlp_ratio=[2, 2], attention_ratio=[2, 2], down_ops=[["Subsample", 4, 16 // 4, 4, 2, 2]])
    c.__dict__["drop_path_rate"] = 0.3
    return families.Logits(T.LevitForImageClassification(c))
models = {
 "swin": lambda: hf("SwinConfig", "SwinForImageClassification", patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=2, drop_path_rate=0.3),
 "swinv2": lambda: hf("Swinv2Config", "Swinv2ForImageClassification", patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=2, drop_path_rate=0.3),
 "beit": lambda: hf("BeitConfig", "BeitForImageClassification", patch_size=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, use_mean_pooling=True, drop_path_rate=0.3),
 "dinov2": lambda: hf("Dinov2Config", "Dinov2ForImageClassification", patch_size=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, drop_path_rate=0.3),
 "levit": lambda: levit(),
 "convnext": lambda: hf("ConvNextConfig", "ConvNextForImageClassification", patch_size=2, num_stages=2, hidden_sizes=[8, 16], depths=[2, 2], drop_path_rate=0.3),
}
y = torch.randint(0, families.CLASSES, (4,))
for name, build in [(k, v) for k, v in models.items() if k in (sys.argv[1:] or models)]:
    for exporter in ("dynamo", "torchscript"):
        try:
            torch.manual_seed(0)
            x = torch.randn(4, 3, 64 if name == "levit" else 16, 64 if name == "levit" else 16)
            m = build().train()
            ref = copy.deepcopy(m).eval()
            plan = memc.compile(m, (x,), optimizer="adamw", lr=1e-3, exporter=exporter, epochs=5)
            with torch.no_grad():
                e = np.abs(plan.predict(x) - ref(x).numpy()).max() / np.abs(ref(x).numpy()).max()
            losses = [round(plan.step(x, y), 5) for _ in range(4)]
            print(f"{name} {exporter}: eval predict vs PyTorch eval {e:.2e}; losses {losses}")
        except Exception as ex:
            print(f"{name} {exporter}: {type(ex).__name__}: {str(ex)[:300]}")
