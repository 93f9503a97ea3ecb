// The layouts of attention's operands. q, k, v and the output y hold one matrix per batch entry
// (b, h): T rows of E elements (the head dim, contiguous). The node's `layout` attr names the
// order of their dims:
//   "bhtd" (the default): [batch..., T, E], any batch dims, which may broadcast;
//   "bthd": [B, T, H, E], the [batch, seq, heads, dim] a transformers export transposes away;
//   "tbhd": [T, B, H, E], torch.nn.MultiheadAttention's sequence-first one.
// Entries are numbered b·H + h in every layout (dropout draws and bias follow that order), and
// an additive bias is indexed [B, H, Tq, Tk] whatever the layout. Non-default layouts let the
// kernels read and write the operands where the projections put them, with no transposes.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>

#include "ir/attr.h"
#include "ir/tensor.h"
#include "support/status.h"

namespace memc {

enum class AttentionLayout { kBHTD, kBTHD, kTBHD };

// The node's layout; an unknown name is bad input.
Expected<AttentionLayout> attention_layout(const Attrs& attrs);
std::string_view attention_layout_name(AttentionLayout layout);

// One operand split into its entries' batch dims ([B, H] in the non-default layouts), rows and
// row length.
struct AttentionOperand {
  Shape batch;
  int64_t t = 0, e = 0;
};
// Fails unless the shape has rank 4 (non-default layouts) or ≥ 2.
Expected<AttentionOperand> attention_operand(AttentionLayout layout, const Shape& shape);
// For nodes their shape function accepted: the layout and an operand's split (default and
// empty on a bad node, never failing).
AttentionLayout attention_layout_of(const Attrs& attrs);
AttentionOperand attention_operand_of(AttentionLayout layout, const Shape& shape);
// The steps (in elements) of an operand's B, H, T and E dims in `layout`, for [B, H] entries of
// t rows × e: element (b, h, t, e) sits at b·s₀ + h·s₁ + t·s₂ + e·s₃.
std::array<int64_t, 4> attention_steps(AttentionLayout layout, int64_t b, int64_t h, int64_t t, int64_t e);
// The operand shape of entries `batch` with t rows of e, in `layout`.
Shape attention_operand_shape(AttentionLayout layout, const Shape& batch, int64_t t, int64_t e);

}  // namespace memc
