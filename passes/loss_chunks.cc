#include "passes/loss_chunks.h"

#include <algorithm>
#include <optional>

#include "ir/grad.h"
#include "ir/op_registry.h"
#include "passes/emit.h"
#include "support/size.h"

namespace memc {
namespace {

constexpr std::string_view kSource = "loss chunks";
ValueId emit(Module& m, const std::string& op, std::vector<ValueId> inputs, Attrs attrs = {}) {
  return emit_node(m, kSource, op, std::move(inputs), std::move(attrs));
}
ValueId cast(Module& m, ValueId v, DType to) { return emit_cast(m, kSource, v, to); }
ValueId rows_of(Module& m, ValueId v, int64_t begin, int64_t end) { return emit_rows(m, kSource, v, begin, end); }

ValueId reshape(Module& m, ValueId v, Shape shape) {
  return m.value(v).type.shape == shape ? v : emit(m, "reshape", {v}, make_attrs({{"shape", std::move(shape)}}));
}

// The head before a language model's logits: `matmul` (a linear, or a matmul by a 2-D weight)
// reads x [N, T..., E] as its first input, and `chain` (in order) carries its result to the
// logits with the same elements: elementwise ops whose other inputs are the same for every row
// and untrained (a softcap's divisor, a final logits bias buffer), casts, and reshapes. Each
// chain link names which input carries the head's values.
struct Head {
  struct Link {
    NodeId node = kNoNode;
    size_t data = 0;  // the input the previous link (or the matmul) feeds
  };
  NodeId matmul = kNoNode;
  std::vector<Link> chain;
};

// Whether v is computed from a trained parameter (its gradient would be wanted).
bool reaches_param(const Module& m, ValueId v) {
  std::vector<ValueId> stack{v};
  std::vector<bool> seen(m.values().size(), false);
  while (!stack.empty()) {
    const ValueId u = stack.back();
    stack.pop_back();
    if (u == kNoValue || seen[u]) continue;
    seen[u] = true;
    if (m.value(u).role == Role::kParam) return true;
    if (m.value(u).producer != kNoNode) {
      for (ValueId in : m.node(m.value(u).producer).inputs) stack.push_back(in);
    }
  }
  return false;
}

// Where node's values come from: the one input of the logits' `type`, when every other input is
// the same for every row (a single value, or one value per class: [..., 1, V]) and untrained;
// -1 when there is none, -2 (with `why`) when such an input is trained.
int data_input(const Module& m, const Node& node, const TensorType& type, std::string& why) {
  int data = -1;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ValueId v = node.inputs[i];
    if (v == kNoValue) continue;
    const TensorType& t = m.value(v).type;
    if (t.numel() == type.numel() && data < 0) {
      data = static_cast<int>(i);
      continue;
    }
    const bool per_row = t.numel() == 1 || (!t.shape.empty() && t.shape.back() == type.shape.back() && t.numel() == type.shape.back());
    if (!per_row) return -1;
    if (reaches_param(m, v)) {
      why = str_cat("memc.", node.op, "'s operand '", m.value(v).source_name.empty() ? m.value(v).name : m.value(v).source_name,
                    "' between the head's linear layer and them is trained");
      return -2;
    }
  }
  return data;
}

// The head of `logits`, or nullopt with `why` when there is none.
std::optional<Head> find_head(const Module& m, ValueId logits, std::string& why) {
  Head head;
  const TensorType& type = m.value(logits).type;
  ValueId v = logits;
  for (;;) {
    const NodeId p = m.value(v).producer;
    if (p == kNoNode) {
      why = "they are not computed by a linear layer";
      return std::nullopt;
    }
    const Node& node = m.node(p);
    if (node.op == "linear" || node.op == "matmul") {
      const TensorType &x = m.value(node.inputs[0]).type, &w = m.value(node.inputs[1]).type;
      const bool rows_times_weight = w.shape.size() == 2 && x.shape.size() >= 2 && node.attrs.get_int("transpose_a", 0) == 0 &&
                                     m.value(node.outputs[0]).type.shape.back() == type.shape.back();
      if (!rows_times_weight) {
        why = str_cat("they come from memc.", node.op, " of ", type_str(x), " and ", type_str(w), ", not of rows and a 2-D weight");
        return std::nullopt;
      }
      head.matmul = p;
      std::reverse(head.chain.begin(), head.chain.end());
      return head;
    }
    const OpDef* def = node.def;
    const bool differentiable = def && def->grad && !(def->flags & (kOpRandom | kOpNoGradient));
    const bool link = node.outputs.size() == 1 && differentiable &&
                      ((def->flags & kOpElementwise) || node.op == "cast" || node.op == "reshape");
    const int data = link ? data_input(m, node, type, why) : -1;
    if (data < 0) {
      if (data == -1) why = str_cat("memc.", node.op, node.source.empty() ? "" : " (" + node.source + ")", " stands between the head's linear layer and them");
      return std::nullopt;
    }
    head.chain.push_back({p, static_cast<size_t>(data)});
    v = node.inputs[static_cast<size_t>(data)];
  }
}

// Emits `head` on the rows `x_rows` [r, E]: the logits [r, V] of those rows.
std::vector<NodeId> emit_chunk(Module& m, const Head& head, ValueId x_rows) {
  std::vector<NodeId> nodes;
  const Node matmul = m.node(head.matmul);  // copies: emitting reallocates the node table
  std::vector<ValueId> inputs = matmul.inputs;
  inputs[0] = x_rows;
  ValueId y = emit(m, matmul.op, inputs, matmul.attrs);
  nodes.push_back(m.value(y).producer);
  for (const Head::Link& link : head.chain) {
    const Node node = m.node(link.node);
    if (node.op == "reshape") continue;  // the chunk stays [r, V]
    inputs = node.inputs;
    inputs[link.data] = y;
    for (size_t i = 0; i < inputs.size(); ++i) {  // the same for every row: [numel], so it broadcasts over the chunk's [r, V]
      if (i != link.data && inputs[i] != kNoValue && m.value(inputs[i]).type.shape.size() > 1) {
        inputs[i] = reshape(m, inputs[i], {m.value(inputs[i]).type.numel()});
      }
    }
    y = emit(m, node.op, inputs, node.attrs);
    nodes.push_back(m.value(y).producer);
  }
  return nodes;
}

// The gradient rule of node `n` given its output's gradient `dy`, for the inputs `needs` marks.
Expected<std::vector<ValueId>> input_grads(Module& m, NodeId n, ValueId dy, std::vector<bool> needs) {
  const Node node = m.node(n);
  GradBuilder builder(m, node, {dy}, std::move(needs));
  MEMC_RETURN_IF_ERROR(node.def->grad(builder).with_context(str_cat("loss chunks: the gradient of memc.", node.op, ": ")));
  return builder.input_grads();
}

// Adds `g` (widened to f32) into the running f32 sum `sum` (kNoValue: none yet).
ValueId add_f32(Module& m, ValueId sum, ValueId g) {
  const ValueId wide = cast(m, g, DType::kF32);
  return sum == kNoValue ? wide : emit(m, "add", {sum, wide});
}

// The seed of a weight (or bias) from its chunks' f32 sum: under a mixed precision the head
// reads a 16-bit cast of an f32 parameter, and the sum seeds that f32 value itself, so it is
// not rounded to 16 bits and widened again; otherwise the weight, with the sum cast to its dtype.
Autodiff::Seed sum_seed(Module& m, ValueId weight, ValueId sum) {
  const NodeId p = m.value(weight).producer;
  if (p != kNoNode && m.node(p).op == "cast" && m.value(m.node(p).inputs[0]).type.dtype == DType::kF32) {
    return {m.node(p).inputs[0], sum};
  }
  return {weight, cast(m, sum, m.value(weight).type.dtype)};
}

// The loss over `rows` chunks of `head`, and the seeds of its inputs (see the header).
Expected<LossStart> chunked_loss(Module& m, const Head& head, ValueId labels, const LossRows& rows, ValueId scale, int64_t chunks) {
  const Node matmul = m.node(head.matmul);
  const ValueId x = matmul.inputs[0];
  const Shape x_shape = m.value(x).type.shape;
  const int64_t width = x_shape.back(), positions = numel(x_shape) / std::max<int64_t>(width, 1);
  const ValueId x_rows = reshape(m, x, {positions, width});
  const ValueId flat_labels = reshape(m, labels, {positions});
  // d(loss·scale)/d(a chunk's sum) = scale / kept, known before any chunk runs.
  const ValueId per_sum = emit(m, "div", {scale == kNoValue ? f32_scalar(m, 1.0) : scale, rows.kept});
  const Attrs loss_attrs = make_attrs({{"ignore_index", kIgnoreLabel}, {"divisor", 1.0}});
  const bool bias = matmul.inputs.size() > 2 && matmul.inputs[2] != kNoValue;
  ValueId total = kNoValue, dw = kNoValue, db = kNoValue;
  std::vector<ValueId> dx;
  const std::vector<int64_t> sizes = micro_batch_sizes(positions, std::min(chunks, positions));
  int64_t first = 0;
  for (int64_t size : sizes) {
    const ValueId xc = rows_of(m, x_rows, first, first + size), lc = rows_of(m, flat_labels, first, first + size);
    first += size;
    const std::vector<NodeId> nodes = emit_chunk(m, head, xc);
    const ValueId logits = m.node(nodes.back()).outputs[0];
    const ValueId sum = emit(m, "softmax_cross_entropy", {logits, lc}, loss_attrs);
    total = total == kNoValue ? sum : emit(m, "add", {total, sum});
    ValueId dy = emit(m, "softmax_cross_entropy_grad", {per_sum, logits, lc}, loss_attrs);
    for (size_t i = nodes.size() - 1; i > 0; --i) {  // the chain, back to the matmul
      const Node& node = m.node(nodes[i]);
      std::vector<bool> needs(node.inputs.size(), false);
      const size_t data = static_cast<size_t>(std::find(node.inputs.begin(), node.inputs.end(), m.node(nodes[i - 1]).outputs[0]) - node.inputs.begin());
      needs[data] = true;
      MEMC_ASSIGN_OR_RETURN(const std::vector<ValueId> grads, input_grads(m, nodes[i], dy, needs));
      dy = grads[data];
      if (dy == kNoValue) return Status::BadInput(str_cat("--loss-chunks: memc.", node.op, " after the head passes no gradient"));
    }
    MEMC_ASSIGN_OR_RETURN(const std::vector<ValueId> grads, input_grads(m, nodes[0], dy, {true, true, bias}));
    dx.push_back(grads[0]);
    dw = add_f32(m, dw, grads[1]);
    if (bias) db = add_f32(m, db, grads[2]);
  }
  LossStart start{.loss = emit(m, "div", {total, rows.kept}), .chunks = static_cast<int64_t>(sizes.size())};
  const ValueId all_dx = dx.size() == 1 ? dx[0] : emit(m, "concat", dx, make_attrs({{"axis", int64_t{0}}}));
  start.seeds.push_back({x, reshape(m, all_dx, x_shape)});
  start.seeds.push_back(sum_seed(m, matmul.inputs[1], dw));
  if (bias) start.seeds.push_back(sum_seed(m, matmul.inputs[2], db));
  return start;
}

// The chunks `auto` takes for logits of `type` from `head` (auto_loss_chunks, in the header).
int64_t auto_chunks(const Module& m, const TensorType& type, const Head& head) {
  const int64_t width = m.value(m.node(head.matmul).inputs[0]).type.shape.back();
  const int64_t vocab = type.shape.back(), positions = type.numel() / std::max<int64_t>(vocab, 1);
  // A chunk's logits no smaller than the head's weight (the f32 sum of its gradient is live
  // anyway, and each further chunk adds one more pass over it) nor than four times x.
  const int64_t by_weight = positions / std::max<int64_t>(width, 1);
  const int64_t by_input = (vocab + 4 * width - 1) / std::max<int64_t>(4 * width, 1);
  const int64_t chunks = std::min({positions, by_weight, by_input});
  return chunks >= 2 ? chunks : 1;
}

}  // namespace

Expected<LossStart> differentiable_loss(Module& m, ValueId logits, ValueId labels, const LossRows& rows, ValueId scale) {
  const TensorType& type = m.value(logits).type;
  const int64_t positions = type.numel() / std::max<int64_t>(type.shape.back(), 1);
  if (rows.kept != kNoValue && rows.chunks != 1 && positions > 1) {  // token labels; one position: nothing to chunk
    std::string why;
    const std::optional<Head> head = find_head(m, logits, why);
    const int64_t chunks = !head ? 1 : rows.chunks == 0 ? auto_chunks(m, type, *head) : rows.chunks;
    if (chunks > 1) return chunked_loss(m, *head, labels, rows, scale, chunks);
    if (rows.chunks > 1) {
      return Status::BadInput(str_cat("--loss-chunks ", rows.chunks, ": the logits '", m.value(logits).source_name, "' have no head to chunk: ", why));
    }
  }
  LossStart start{.loss = cross_entropy(m, logits, labels, rows)};
  ValueId for_grad = start.loss;
  if (scale != kNoValue) {
    for_grad = emit(m, "mul", {start.loss, scale});
    m.rename(for_grad, "scaled_loss");
  }
  start.seeds.push_back(Autodiff::unit_seed(m, for_grad));
  return start;
}

int64_t auto_loss_chunks(const Module& m, ValueId logits) {
  const TensorType& type = m.value(logits).type;
  if (type.shape.size() < 3) return 1;  // a classifier's [N, C]
  std::string why;
  const std::optional<Head> head = find_head(m, logits, why);
  return head ? auto_chunks(m, type, *head) : 1;
}

}  // namespace memc
