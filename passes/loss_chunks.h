// A language model's head and loss in chunks of positions (the `loss_chunks` memory pass).
//
// A language model's logits [N, T, V] and their gradient are its largest activations: GPT-2 at
// batch 8 and 1,024 positions holds 1.65 GB of f32 logits, and as much again for dlogits, at
// the head of the backward, where every saved activation is live too. With the loss in K chunks
// of positions, each chunk computes its logits from its rows of the head's input x, its loss
// sum, and at once the gradient of that loss: d loss/d logits is known in the forward (the loss
// is the final value, so its cotangent is loss_scale/kept), so the chunk's dlogits, dx and dW
// are computed before the next chunk's logits exist (Liger's fused linear cross-entropy, with
// memc's own ops). What autodiff then starts from is not the loss but the head's inputs, seeded
// with their gradients: x with the chunks' dx in order, the weight and bias with the sums of the
// chunks' (summed in f32; under a mixed precision they seed the f32 parameter the head's 16-bit
// copy is cast from, else they are cast once to the weight's dtype).
//
// The head is the last linear (or matmul by a 2-D weight) before the logits, with any chain of
// elementwise ops, casts and reshapes after it whose other inputs are the same for every row
// and untrained (a logit softcap's division, tanh and product; BART's final_logits_bias buffer).
// One chunk's logits and dlogits are live at a time, so the head's share of the peak falls by
// about K; what is added is K - 1 sums of the weight's gradient.
// Exact up to summation order in f32: the loss is the sum of the chunks' sums divided by the
// count, and dW the sum of the chunks' products. A 16-bit head rounds each chunk's dW to 16 bits
// (its GEMM's output) where the whole loss rounds the total once.
#pragma once
#include <vector>

#include "ir/graph.h"
#include "passes/autodiff.h"
#include "passes/microbatch.h"

namespace memc {

// A loss and what autodiff starts from to differentiate loss·scale.
struct LossStart {
  ValueId loss = kNoValue;             // f32 scalar
  std::vector<Autodiff::Seed> seeds;   // (loss·scale, 1), or the chunked head's inputs
  int64_t chunks = 1;                  // the head's chunks (1: not chunked)
};

// The loss of `logits` against `labels` (cross_entropy, microbatch.h) and its seeds. `scale`:
// the loss scale (kNoValue: none). Token labels with rows.chunks > 1 chunk the head into
// min(chunks, positions) chunks; when the logits are not a head's (no linear before them),
// a loss of rows.chunks > 1 is refused, and rows.chunks = 0 (auto) leaves it whole.
Expected<LossStart> differentiable_loss(Module& m, ValueId logits, ValueId labels, const LossRows& rows, ValueId scale);

// The chunks `--loss-chunks auto` takes for a forward whose first output is `logits`: token
// logits [R positions, V] from a head of width E chunk so that a chunk's logits are no smaller
// than the head's weight [V, E] (whose f32 gradient sum is live anyway, and which each further
// chunk passes over once more) nor than four times x: min(⌊R / E⌋, ⌈V / 4E⌉); 1 (none) for a
// classifier's [N, C], a head that is not found, or fewer than 2 chunks.
int64_t auto_loss_chunks(const Module& m, ValueId logits);

}  // namespace memc
