#!/usr/bin/env python3
"""Writes the small committed data sets under data/ (see models/README.md).

  data/digits_train.npz, data/digits_test.npz
      scikit-learn's bundled digits (load_digits: 1,797 8x8 images, 10 classes,
      no download). Keys: x float32 Nx1x8x8 (pixels / 16.0, so in [0, 1]),
      y int64 N. Stratified 80/20 split, random_state=0 -> 1437 / 360.

  data/text_train.npz, data/text_test.npz
      Synthetic "order" task, T=32, vocab 64. Keys: input_ids int64 NxT,
      attention_mask int64 NxT, y int64 N (2 classes).
      Token 0 = PAD, token 1 = marker A, token 2 = marker B, 3..63 = filler.
      Each sequence has a random valid length L in [24, 32] (right padding with
      0, attention_mask 0 there) and contains A and B exactly once each at
      distinct random positions < L. y = 1 if A comes before B, else 0.
      Every sequence contains the same bag of markers, so the label cannot be
      read from token counts: it needs positions and attention across the
      sequence. 2000 train / 500 test, seed 1234 / 5678.

  data/text64_train.npz, data/text64_test.npz
      The same samples right-padded with PAD (mask 0) to T=64, for
      bigbird_sparse (HF BigBird falls back to full attention for
      T <= (5 + 2*num_random_blocks)*block_size = 36).

Files are written with np.savez (stored, not deflated) so a minimal zip reader
can load them. Usage: /work/venv/bin/python models/make_data.py
"""
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data")

TEXT_T = 32
TEXT_VOCAB = 64
PAD, TOK_A, TOK_B = 0, 1, 2
FIRST_FILLER = 3
MIN_LEN = 24


def make_digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y, shuffle=True)
    return (np.ascontiguousarray(x_tr), y_tr), (np.ascontiguousarray(x_te), y_te)


def make_text(n, seed, T=TEXT_T):
    rng = np.random.default_rng(seed)
    ids = np.full((n, T), PAD, dtype=np.int64)
    mask = np.zeros((n, T), dtype=np.int64)
    y = np.zeros(n, dtype=np.int64)
    for i in range(n):
        L = int(rng.integers(MIN_LEN, T + 1))
        ids[i, :L] = rng.integers(FIRST_FILLER, TEXT_VOCAB, size=L)
        pa, pb = rng.choice(L, size=2, replace=False)
        ids[i, pa] = TOK_A
        ids[i, pb] = TOK_B
        mask[i, :L] = 1
        y[i] = 1 if pa < pb else 0
    return ids, mask, y


def pad_to(ids, mask, T):
    n, t = ids.shape
    ids2 = np.full((n, T), PAD, dtype=np.int64)
    mask2 = np.zeros((n, T), dtype=np.int64)
    ids2[:, :t] = ids
    mask2[:, :t] = mask
    return ids2, mask2


def main():
    os.makedirs(DATA, exist_ok=True)
    (x_tr, y_tr), (x_te, y_te) = make_digits()
    np.savez(os.path.join(DATA, "digits_train.npz"), x=x_tr, y=y_tr)
    np.savez(os.path.join(DATA, "digits_test.npz"), x=x_te, y=y_te)
    print("digits train", x_tr.shape, np.bincount(y_tr), "test", x_te.shape, np.bincount(y_te))

    for split, n, seed in (("train", 2000, 1234), ("test", 500, 5678)):
        ids, mask, y = make_text(n, seed)
        np.savez(os.path.join(DATA, f"text_{split}.npz"), input_ids=ids, attention_mask=mask, y=y)
        ids64, mask64 = pad_to(ids, mask, 64)
        np.savez(os.path.join(DATA, f"text64_{split}.npz"), input_ids=ids64, attention_mask=mask64, y=y)
        print(f"text {split}", ids.shape, "labels", np.bincount(y), "mean len", mask.sum(1).mean())


if __name__ == "__main__":
    main()
