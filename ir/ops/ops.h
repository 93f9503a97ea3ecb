// Registration entry points of each op family, and helpers their shape functions share.
#pragma once
#include <string_view>
#include <cstdint>

#include "ir/op_registry.h"

namespace memc {

void register_elementwise_ops(OpRegistry& r);
void register_linalg_ops(OpRegistry& r);
void register_reduce_ops(OpRegistry& r);
void register_shape_ops(OpRegistry& r);
void register_misc_ops(OpRegistry& r);
void register_training_ops(OpRegistry& r);
void register_optimizer_ops(OpRegistry& r);  // loss, fills, fused backward ops
void register_collective_ops(OpRegistry& r);  // all_gather, reduce_scatter, all_reduce, broadcast (+ start/done)
void register_gradients(OpRegistry& r);      // sets OpDef::grad on every differentiable op  // ops the frontend needs beyond the core families

// Numpy broadcasting of two shapes; fails if a pair of dims is neither equal nor 1.
Expected<Shape> broadcast_shapes(const Shape& a, const Shape& b);
// Bounds every shape an op can be asked to build, so shape arithmetic never overflows:
// dims in [0, 2^40], element counts up to 2^48 (the limits of the IR text form too).
inline constexpr int64_t kMaxDim = int64_t{1} << 40;
inline constexpr int64_t kMaxElements = int64_t{1} << 48;
Status check_shape(const Shape& shape, const char* what);
// An attribute integer (stride, pad, repeat) within ±2^40.
Status check_small(const std::vector<int64_t>& values, const char* what);

// A gather index that names no row: the frontend computes it for an index tuple outside the
// data's dims (GatherND with runtime indices), and gather kernels refuse it saying so.
inline constexpr int64_t kGatherNoRow = INT64_MIN;

// pad's source along one dim: the input coordinate output coordinate `o` reads, or -1 where the
// constant fills. Reflect mirrors without repeating the edge (numpy "reflect"), periodically for
// wide pads; edge repeats the border element. The CPU kernel and the gradient rule use it.
int64_t pad_source_index(int64_t o, int64_t in, int64_t begin, std::string_view mode);

// Checks every axis in `axes` lies in [0, rank) and appears once.
Status check_axes(const std::vector<int64_t>& axes, int64_t rank, const char* what);

// Where pieces of `numels` elements start in a flat buffer: each at the multiple of `align` at or
// after the previous one's end (align 1: packed). The shard pass lays out its units so.
std::vector<int64_t> flat_offsets(const std::vector<int64_t>& numels, int64_t align);
// Where each piece of split_flat starts in its flat input: {offsets}, or packed from 0.
std::vector<int64_t> split_flat_offsets(const Attrs& attrs);

}  // namespace memc
