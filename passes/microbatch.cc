#include "passes/microbatch.h"

#include <algorithm>
#include <map>

#include "ir/attention_layout.h"
#include "ir/grad.h"
#include "ir/op_registry.h"
#include "passes/autodiff.h"
#include "passes/emit.h"
#include "passes/loss_chunks.h"

namespace memc {
namespace {

constexpr std::string_view kSource = kMicroBatchSource;
ValueId emit(Module& m, const std::string& op, std::vector<ValueId> inputs, Attrs attrs = {}, std::string_view source = kSource) {
  return emit_node(m, source, op, std::move(inputs), std::move(attrs));
}
ValueId rows(Module& m, ValueId v, int64_t begin, int64_t end) { return emit_rows(m, kSource, v, begin, end); }
ValueId cast(Module& m, ValueId v, DType to) { return emit_cast(m, kSource, v, to); }

// Copies the nodes of `src` into `dst`; src argument i reads `args[i]`. Returns src's outputs.
// Names get a "mb<i>." prefix so every copy stays readable in dumps.
std::vector<ValueId> inline_forward(Module& dst, const Module& src, const std::vector<ValueId>& args,
                                    const std::string& prefix) {
  std::vector<ValueId> map(src.values().size(), kNoValue);
  for (size_t i = 0; i < src.arguments().size(); ++i) map[src.arguments()[i]] = args[i];
  for (NodeId n : src.schedule()) {
    const Node& node = src.node(n);
    std::vector<ValueId> inputs;
    for (ValueId v : node.inputs) inputs.push_back(v == kNoValue ? kNoValue : map[v]);
    std::vector<TensorType> types;
    std::vector<std::string> names;
    for (ValueId v : node.outputs) {
      types.push_back(src.value(v).type);
      names.push_back(prefix + src.value(v).name);
    }
    const NodeId copy = dst.add_node_typed(node.op, std::move(inputs), node.attrs, std::move(types), std::move(names), node.source);
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const ValueId out = dst.node(copy).outputs[k];
      dst.value(out).role = src.value(node.outputs[k]).role;
      dst.value(out).source_name = src.value(node.outputs[k]).source_name;
      map[node.outputs[k]] = out;
    }
  }
  std::vector<ValueId> outputs;
  for (ValueId v : src.outputs()) outputs.push_back(map[v]);
  return outputs;
}

// Random ops of a micro-batch starting at sample `first` draw the full batch's counters.
void offset_random_draws(Module& m, NodeId first_node, int64_t first, int64_t micro_batch) {
  if (first == 0) return;
  for (NodeId n = first_node; n < static_cast<NodeId>(m.nodes().size()); ++n) {
    Node& node = m.node(n);
    const int64_t per_sample = random_draws_per_sample(m, node, micro_batch);
    if (per_sample > 0) node.attrs.set("rng_offset", first * per_sample);
  }
}

// The step's data inputs other than the labels, each split along its first dimension [batch, …].
Expected<std::vector<ValueId>> batch_inputs(const Module& module, ValueId labels, int64_t batch) {
  std::vector<ValueId> inputs;
  for (ValueId a : module.arguments()) {
    if (a == labels || module.value(a).role != Role::kInput) continue;
    const Shape& s = module.value(a).type.shape;
    if (s.empty() || s[0] != batch) {
      return Status::BadInput(str_cat("micro-batching splits inputs along their first dimension; input '", module.value(a).source_name,
                                      "' is [", shape_str(s), "], not [", batch, ", ...]"));
    }
    inputs.push_back(a);
  }
  return inputs;
}

// The forward imported at n samples must take inputs [n, …] and give logits [n, C]; an export
// that fixes the batch ignores the requested size, and nothing can be split then.
Status check_forward_batch(const Module& f, int64_t n) {
  for (ValueId v : f.arguments()) {
    const TensorType& t = f.value(v).type;
    if (f.value(v).role == Role::kInput && (t.shape.empty() || t.shape[0] != n)) {
      return Status::BadInput(str_cat("micro-batches of ", n, " samples need the model at batch ", n, ", but input '",
                                      f.value(v).source_name, "' stays [", shape_str(t.shape),
                                      "] (the export fixes its batch; re-export with a dynamic batch dimension)"));
    }
  }
  if (f.outputs().empty() || f.value(f.outputs()[0]).type.shape.empty() || f.value(f.outputs()[0]).type.shape[0] != n) {
    return Status::BadInput(str_cat("micro-batches of ", n, " samples need logits [", n, ", C] from the model at batch ", n,
                                    " (the export fixes its batch; re-export with a dynamic batch dimension)"));
  }
  return Status::Ok();
}

// One micro-batch: samples [first, first + size) of the step's batch, the index-th of k.
struct MicroBatch {
  size_t index;
  int64_t first, size;
  std::string prefix() const { return str_cat("mb", index, "."); }
};

// Appends micro-batches one at a time to `module`. After each, sums_[p] holds the parameter's
// gradient summed over the micro-batches so far and step_.loss their weighted losses.
class Accumulator {
 public:
  Accumulator(Module& module, ValueId labels, const std::vector<ValueId>& params, ValueId scale, const LossRows& loss,
              std::vector<ValueId> inputs, const ParamBinder& bind)
      : m_(module), labels_(labels), params_(params), scale_(scale), loss_(loss), inputs_(std::move(inputs)), bind_(bind),
        sums_(params.size(), kNoValue) {}

  // Forward (from `f`), loss and backward of one micro-batch, then the adds into the sums.
  Status add(const Module& f, const MicroBatch& mb, const AfterAutodiff& after_autodiff) {
    const NodeId forward_begin = static_cast<NodeId>(m_.nodes().size());
    std::vector<NodeId> bound;
    MEMC_ASSIGN_OR_RETURN(std::vector<ValueId> args, arguments(f, mb, bound));
    const std::vector<ValueId> outs = inline_forward(m_, f, args, mb.prefix());
    sink_to_first_reader(bound);
    offset_random_draws(m_, forward_begin, mb.first, mb.size);
    MEMC_ASSIGN_OR_RETURN(const LossStart start, weighted_loss(outs[0], mb));
    const ValueId loss = start.loss;
    step_.loss_chunks = std::max(step_.loss_chunks, start.chunks);
    const auto backward_begin = static_cast<NodeId>(m_.nodes().size());
    MEMC_ASSIGN_OR_RETURN(std::vector<ValueId> grads, Autodiff().run(m_, start.seeds, params_));
    if (after_autodiff) {
      MEMC_RETURN_IF_ERROR(after_autodiff(m_, forward_begin, backward_begin, static_cast<NodeId>(m_.nodes().size())));
    }
    accumulate(grads, mb);
    step_.loss = step_.loss == kNoValue ? loss : emit(m_, "add", {step_.loss, loss});
    logits_.push_back(outs[0]);
    return Status::Ok();
  }

  // The gradients (one value per parameter, named grad.<param>), the logits of the whole batch,
  // and each accumulation scheduled right after the gradient it adds.
  AccumulatedStep finish() {
    for (size_t p = 0; p < params_.size(); ++p) {
      ValueId g = cast(m_, sums_[p], m_.value(params_[p]).type.dtype);
      if (g == params_[p] || m_.value(g).producer == kNoNode) g = emit(m_, "copy", {g});
      m_.value(g).role = Role::kGrad;
      m_.rename(g, "grad." + m_.value(params_[p]).name);
      step_.grads.push_back(g);
    }
    step_.logits = logits_.size() == 1 ? logits_[0] : emit(m_, "concat", logits_, make_attrs({{"axis", int64_t{0}}}));
    schedule_accumulations();
    return step_;
  }

 private:
  // f's arguments in the step: inputs by position among inputs (their rows of the micro-batch),
  // params and others by name; `bound` gets the nodes a bound parameter added (its gather).
  Expected<std::vector<ValueId>> arguments(const Module& f, const MicroBatch& mb, std::vector<NodeId>& bound) {
    std::vector<ValueId> args;
    size_t next_input = 0;
    for (ValueId a : f.arguments()) {
      const Value& fa = f.value(a);
      if (fa.role == Role::kInput) {
        if (next_input >= inputs_.size()) return Status::Internal("micro-batch forward has more inputs than the step");
        args.push_back(rows(m_, inputs_[next_input++], mb.first, mb.first + mb.size));
      } else if (fa.role == Role::kParam && bind_ && !is_argument(fa.name)) {
        const auto first_new = static_cast<NodeId>(m_.nodes().size());
        MEMC_ASSIGN_OR_RETURN(const ValueId value, bind_(fa.source_name, mb.index));
        if (m_.value(value).type != fa.type) return Status::Internal(str_cat("parameter '", fa.source_name, "' bound to a value of another type"));
        for (NodeId n = first_new; n < static_cast<NodeId>(m_.nodes().size()); ++n) bound.push_back(n);
        args.push_back(value);
      } else {
        const ValueId same = m_.find_value(fa.name);
        if (same == kNoValue || m_.value(same).type != fa.type) {
          return Status::Internal(str_cat("micro-batch forward argument '", fa.name, "' has no match in the step"));
        }
        args.push_back(same);
      }
    }
    return args;
  }

  // The nodes that built the micro-batch's bound parameters (each unit's gather), each moved to
  // right before its first scheduled reader. Built before the forward was inlined, they would
  // all run first: every unit's gathered parameters live at once, and autodiff (which walks the
  // schedule backwards) would reduce every unit's gradient only at the end of the backward.
  // In reverse creation order, so a node's own inputs move before it.
  void sink_to_first_reader(const std::vector<NodeId>& nodes) {
    if (nodes.empty()) return;
    std::vector<NodeId> order = m_.schedule();
    // They and their readers were all made for this micro-batch (a reader after what it reads):
    // each lies at or after the first position of a node made since the first of them, so the
    // scans start there and do not grow with the micro-batches before.
    const NodeId first_made = *std::min_element(nodes.begin(), nodes.end());
    const auto tail = std::find_if(order.begin(), order.end(), [&](NodeId x) { return x >= first_made; }) - order.begin();
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
      const NodeId n = *it;
      const auto self = std::find(order.begin() + tail, order.end(), n);
      if (self == order.end()) continue;
      order.erase(self);
      const std::vector<ValueId>& outs = m_.node(n).outputs;
      auto reads = [&](NodeId r) {
        if (m_.node(r).dead) return false;
        return std::any_of(m_.node(r).inputs.begin(), m_.node(r).inputs.end(),
                           [&](ValueId v) { return v != kNoValue && std::find(outs.begin(), outs.end(), v) != outs.end(); });
      };
      order.insert(std::find_if(order.begin() + tail, order.end(), reads), n);
    }
    m_.set_schedule(order);
  }

  bool is_argument(const std::string& name) const {
    const ValueId v = m_.find_value(name);
    return v != kNoValue && std::find(m_.arguments().begin(), m_.arguments().end(), v) != m_.arguments().end();
  }

  // The micro-batch's mean loss weighted by n_i/N, so the weighted losses sum to the batch's mean
  // (N: the loss's divisor where it has one). Token labels: the micro-batch's sum over the whole
  // batch's kept labels, which the micro-batches' losses add up to as well.
  // Returns it with what autodiff starts from (passes/loss_chunks.h).
  Expected<LossStart> weighted_loss(ValueId logits, const MicroBatch& mb) {
    const ValueId mb_labels = rows(m_, labels_, mb.first, mb.first + mb.size);
    if (loss_.kept != kNoValue) {
      MEMC_ASSIGN_OR_RETURN(LossStart start, differentiable_loss(m_, logits, mb_labels, loss_, scale_));
      m_.rename(start.loss, mb.prefix() + "loss");
      return start;
    }
    Attrs attrs = loss_.attrs();
    attrs.erase("divisor");
    const ValueId loss = emit(m_, "softmax_cross_entropy", {logits, mb_labels}, std::move(attrs));
    const double batch = loss_.divisor > 0 ? loss_.divisor : static_cast<double>(m_.value(labels_).type.shape[0]);
    const double weight = static_cast<double>(mb.size) / batch;
    const ValueId weighted = emit(m_, "mul", {loss, f32_scalar(m_, weight, "mb_weight")});
    m_.rename(weighted, mb.prefix() + "loss");
    const ValueId for_grad = scale_ == kNoValue ? weighted : emit(m_, "mul", {weighted, scale_});
    return LossStart{.loss = weighted, .seeds = {Autodiff::unit_seed(m_, for_grad)}};
  }

  // Adds each gradient into its running sum (the first micro-batch's gradient starts it).
  void accumulate(const std::vector<ValueId>& grads, const MicroBatch& mb) {
    for (size_t p = 0; p < params_.size(); ++p) {
      m_.rename(grads[p], mb.prefix() + m_.value(grads[p]).name);
      // The running sum has the parameter's dtype, as PyTorch's .grad: f32 under fp32 and the
      // mixed modes (f32 master weights), 16-bit under the -true modes.
      const ValueId g = cast(m_, grads[p], m_.value(params_[p]).type.dtype);
      m_.value(g).role = Role::kGrad;  // the memory breakdown counts accumulators as gradients
      if (sums_[p] == kNoValue) {
        sums_[p] = g;
      } else {
        sums_[p] = emit(m_, "add", {sums_[p], g});
        m_.value(sums_[p]).role = Role::kGrad;
        accumulations_.push_back(m_.value(sums_[p]).producer);
      }
    }
  }

  // Each accumulation runs right after the gradient it adds is complete.
  void schedule_accumulations() {
    std::vector<bool> is_acc(m_.nodes().size(), false);
    for (NodeId a : accumulations_) is_acc[a] = true;
    std::map<NodeId, std::vector<NodeId>> after;  // producer of the added gradient → its adds
    for (NodeId a : accumulations_) {
      // The add reads the gradient or its f32 cast.
      after[m_.value(m_.node(a).inputs[1]).producer].push_back(a);
    }
    std::vector<NodeId> reordered;
    for (NodeId n : m_.schedule()) {
      if (is_acc[n]) continue;
      reordered.push_back(n);
      if (auto it = after.find(n); it != after.end()) {
        for (NodeId a : it->second) reordered.push_back(a);
      }
    }
    m_.set_schedule(reordered);
  }

  Module& m_;
  const ValueId labels_;
  const std::vector<ValueId>& params_;
  const ValueId scale_;
  const LossRows& loss_;
  const std::vector<ValueId> inputs_;  // the step's data inputs [N, …], labels aside
  const ParamBinder& bind_;
  std::vector<ValueId> sums_;          // by parameter: the running sum of its gradients
  std::vector<NodeId> accumulations_;  // the add of each gradient after the first micro-batch
  std::vector<ValueId> logits_;        // by micro-batch
  AccumulatedStep step_;
};

}  // namespace

int64_t random_draws_per_sample(const Module& m, const Node& node, int64_t batch) {
  // Attention draws its optional dropout from the counter RNG too, but the registry does not
  // flag it random (ir/ops/linalg.cc): it is named here, with or without dropout_ratio. Its
  // gradient (dy, q, k, v, [bias]) replays the same draws, so it takes the same offsets.
  const OpDef* def = node.def;
  const bool forward = node.op == "attention", attention = forward || node.op == "attention_grad";
  if (!attention && !(def && (def->flags & kOpRandom))) return 0;
  const TensorType& t = m.value(forward ? node.outputs[0] : node.inputs[0]).type;
  if (attention) {  // one draw per score, entry by entry (b·H + h): [batch, …, Tq, Tk] in any layout
    const AttentionLayout layout = attention_layout_of(node.attrs);
    const AttentionOperand y = attention_operand_of(layout, t.shape),
                           k = attention_operand_of(layout, m.value(node.inputs[forward ? 1 : 2]).type.shape);
    if (y.batch.empty() || y.batch[0] != batch) return 0;  // not batch-outermost: its own draws
    return numel(y.batch) * y.t * k.t / batch;
  }
  if (t.shape.empty() || t.shape[0] != batch) return 0;  // not batch-outermost: its own draws
  return t.numel() / batch;  // one draw per element
}

Attrs LossRows::attrs() const {
  Attrs a;
  if (ignore_label) a.set("ignore_index", *ignore_label);
  if (divisor > 0) a.set("divisor", divisor);
  return a;
}

ValueId cross_entropy(Module& m, ValueId logits, ValueId labels, const LossRows& rows) {
  if (rows.kept == kNoValue) return emit(m, "softmax_cross_entropy", {logits, labels}, rows.attrs(), "loss");
  const TensorType type = m.value(logits).type;
  const int64_t classes = type.shape.back(), positions = type.numel() / std::max<int64_t>(classes, 1);
  const ValueId flat_logits = emit(m, "reshape", {logits}, make_attrs({{"shape", Shape{positions, classes}}}), "loss");
  const ValueId flat_labels = emit(m, "reshape", {labels}, make_attrs({{"shape", Shape{positions}}}), "loss");
  const ValueId sum = emit(m, "softmax_cross_entropy", {flat_logits, flat_labels},
                           make_attrs({{"ignore_index", kIgnoreLabel}, {"divisor", 1.0}}), "loss");
  return emit(m, "div", {sum, rows.kept}, {}, "loss");
}

std::vector<int64_t> micro_batch_sizes(int64_t batch, int64_t k) {
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < k; ++i) sizes.push_back(batch / k + (i < batch % k ? 1 : 0));
  return sizes;
}

Expected<AccumulatedStep> accumulate_micro_batches(Module& module, const ForwardFactory& forward, int64_t k,
                                                   ValueId labels, const std::vector<ValueId>& params,
                                                   ValueId scale, const LossRows& loss, const AfterAutodiff& after_autodiff,
                                                   const ParamBinder& bind) {
  const int64_t batch = module.value(labels).type.shape[0];
  if (k < 1 || k > batch) return Status::BadInput(str_cat("--micro-batches ", k, " must be between 1 and the batch size ", batch));
  MEMC_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, batch_inputs(module, labels, batch));
  Accumulator accumulator(module, labels, params, scale, loss, std::move(inputs), bind);
  std::map<int64_t, Module> forwards;  // by micro-batch size: at most two imports
  int64_t first = 0;
  const std::vector<int64_t> sizes = micro_batch_sizes(batch, k);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    if (!forwards.count(n)) {
      MEMC_ASSIGN_OR_RETURN(Module f, forward(n));
      forwards.emplace(n, std::move(f));
    }
    MEMC_RETURN_IF_ERROR(check_forward_batch(forwards.at(n), n));
    MEMC_RETURN_IF_ERROR(accumulator.add(forwards.at(n), {.index = i, .first = first, .size = n}, after_autodiff));
    first += n;
  }
  return accumulator.finish();
}

}  // namespace memc
