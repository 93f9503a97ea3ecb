"""Train a Hugging Face ViT with memc from Python, on data read from disk a batch at a time.

    pip install .  transformers          # memc's package, and transformers (with torch)
    python examples/train_hf_vit.py [--budget 300MB] [--steps 200] [--data DIR]

1. builds a small transformers ViTForImageClassification (random init; 8x8 single-channel
   images, 10 classes: the digits of data/digits_train.npz);
2. writes the digits as a folder of .npy shards (what a dataset larger than memory looks like:
   x.0.npy, x.1.npy, …, y.npy), unless --data names one;
3. compiles the module under --budget (memc chooses precision, remat, micro-batches, offload);
4. trains on the folder (memc reads it a batch at a time, never whole) and reports accuracy;
5. loads the trained weights back into the transformers module and checks that its forward
   gives memc's predictions.
"""
import argparse
import os
import tempfile
import warnings

import numpy as np
import torch
from transformers import ViTConfig, ViTForImageClassification

import memc

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


class Logits(torch.nn.Module):
    """transformers' models return an output object; memc trains the logits under cross-entropy."""

    def __init__(self, vit):
        super().__init__()
        self.vit = vit

    def forward(self, pixel_values):
        return self.vit(pixel_values=pixel_values).logits


def write_shards(npz, folder, shards=4):
    data = np.load(npz)
    os.makedirs(folder, exist_ok=True)
    for k, rows in enumerate(np.array_split(np.arange(len(data["y"])), shards)):
        np.save(os.path.join(folder, f"x.{k}.npy"), data["x"][rows])
    np.save(os.path.join(folder, "y.npy"), data["y"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="300MB")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--data", help="a folder of .npy shards (default: the digits, written to a temporary folder)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)  # the exporter's notes on transformers' shape checks

    torch.manual_seed(0)
    config = ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = Logits(ViTForImageClassification(config))
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or os.path.join(tmp, "digits")
        if not args.data:
            write_shards(os.path.join(SRC, "data", "digits_train.npz"), data)
        test = np.load(os.path.join(SRC, "data", "digits_test.npz"))
        example = torch.from_numpy(test["x"][: args.batch])
        plan = memc.compile(model, (example,), budget=args.budget, optimizer="adamw", lr=2e-3, epochs=args.epochs,
                            schedule="warmup-cosine", warmup_steps=100)
        print(f"plan: peak {plan.predicted_peak_bytes:,} bytes under {args.budget}; decisions {plan.decisions}")
        report = plan.fit(data, epochs=args.epochs)
        print(f"trained {report['steps']} steps, loss {report['loss']:.4f}, {report['step_ms']:.1f} ms/step, "
              f"measured peak {report['measured_peak_bytes']:,} bytes, process RSS {report['process_peak_rss_bytes'] / 2**20:.0f} MiB")
        batches = [(test["x"][i:i + args.batch], test["y"][i:i + args.batch]) for i in range(0, len(test["y"]), args.batch)]
        print(f"accuracy {100 * plan.accuracy(batches):.2f}% on the full batches of data/digits_test.npz")
        model.load_state_dict(plan.state_dict())
        with torch.no_grad():
            gap = np.abs(model(example).numpy() - plan.predict(example)).max()
        print(f"the transformers module with memc's weights: forward within {gap:.1e} of memc's predictions "
              f"(memc computes in {plan.decisions['precision']}, the module in fp32)")


if __name__ == "__main__":
    main()
