#include "passes/microbatch.h"

#include <map>

#include "ir/grad.h"
#include "passes/autodiff.h"

namespace memc {
namespace {

ValueId emit(Module& m, const std::string& op, std::vector<ValueId> inputs, Attrs attrs = {}) {
  auto out = m.add_node(op, std::move(inputs), std::move(attrs), "micro-batch");
  MEMC_CHECK(out.ok(), out.status().message());
  return (*out)[0];
}

ValueId rows(Module& m, ValueId v, int64_t begin, int64_t end) {
  return emit(m, "slice", {v}, make_attrs({{"axes", std::vector<int64_t>{0}}, {"starts", std::vector<int64_t>{begin}},
                                           {"ends", std::vector<int64_t>{end}}, {"steps", std::vector<int64_t>{1}}}));
}

ValueId cast(Module& m, ValueId v, DType to) {
  return m.value(v).type.dtype == to ? v : emit(m, "cast", {v}, make_attrs({{"to", std::string(dtype_name(to))}}));
}

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
    if (node.op != "dropout" && node.op != "attention") continue;
    const int64_t per_sample = random_draws_per_sample(m, node, micro_batch);
    if (per_sample > 0) node.attrs.set("rng_offset", first * per_sample);
  }
}

}  // namespace

int64_t random_draws_per_sample(const Module& m, const Node& node, int64_t batch) {
  if (node.op != "dropout" && node.op != "attention") return 0;
  const TensorType& t = m.value(node.outputs[0]).type;
  if (t.shape.empty() || t.shape[0] != batch) return 0;  // not batch-outermost: its own draws
  if (node.op == "dropout") return t.numel() / batch;
  // attention: one draw per score, [batch, …, Tq, Tk]; the output is [batch, …, Tq, Dv]
  return t.numel() / t.shape.back() * m.value(node.inputs[1]).type.shape[t.shape.size() - 2] / batch;
}

std::vector<int64_t> micro_batch_sizes(int64_t batch, int64_t k) {
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < k; ++i) sizes.push_back(batch / k + (i < batch % k ? 1 : 0));
  return sizes;
}

Expected<AccumulatedStep> accumulate_micro_batches(Module& module, const ForwardFactory& forward, int64_t k,
                                                   ValueId labels, const std::vector<ValueId>& params,
                                                   ValueId scale, const AfterAutodiff& after_autodiff) {
  const int64_t batch = module.value(labels).type.shape[0];
  if (k < 1 || k > batch) return Status::BadInput(str_cat("--micro-batches ", k, " must be between 1 and the batch size ", batch));
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
  std::map<int64_t, Module> forwards;  // by micro-batch size: at most two imports
  AccumulatedStep step;
  std::vector<ValueId> logits;
  std::vector<ValueId> sums(params.size(), kNoValue);
  std::vector<NodeId> accumulations;  // the add of each gradient after the first micro-batch
  int64_t first = 0;
  const std::vector<int64_t> sizes = micro_batch_sizes(batch, k);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    if (!forwards.count(n)) {
      MEMC_ASSIGN_OR_RETURN(Module f, forward(n));
      forwards.emplace(n, std::move(f));
    }
    const Module& f = forwards.at(n);
    // An export that fixes the batch ignores the requested size; nothing can be split then.
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
    // Map f's arguments: inputs by position among inputs, params and others by name.
    std::vector<ValueId> args;
    const NodeId first_node = static_cast<NodeId>(module.nodes().size());
    size_t next_input = 0;
    for (ValueId a : f.arguments()) {
      const Value& fa = f.value(a);
      if (fa.role == Role::kInput) {
        if (next_input >= inputs.size()) return Status::Internal("micro-batch forward has more inputs than the step");
        args.push_back(rows(module, inputs[next_input++], first, first + n));
      } else {
        const ValueId same = module.find_value(fa.name);
        if (same == kNoValue || module.value(same).type != fa.type) {
          return Status::Internal(str_cat("micro-batch forward argument '", fa.name, "' has no match in the step"));
        }
        args.push_back(same);
      }
    }
    const std::string prefix = str_cat("mb", i, ".");
    const std::vector<ValueId> outs = inline_forward(module, f, args, prefix);
    offset_random_draws(module, first_node, first, n);
    const ValueId mb_labels = rows(module, labels, first, first + n);
    const ValueId loss = emit(module, "softmax_cross_entropy", {outs[0], mb_labels});
    const double weight = static_cast<double>(n) / static_cast<double>(batch);
    Tensor w = Tensor::zeros(DType::kF32, {});
    w.data<float>()[0] = static_cast<float>(weight);
    const ValueId weighted = emit(module, "mul", {loss, module.add_constant(std::move(w), "mb_weight")});
    module.rename(weighted, prefix + "loss");
    const ValueId for_grad = scale == kNoValue ? weighted : emit(module, "mul", {weighted, scale});
    const auto backward_begin = static_cast<NodeId>(module.nodes().size());
    MEMC_ASSIGN_OR_RETURN(std::vector<ValueId> grads, Autodiff().run(module, for_grad, params));
    if (after_autodiff) {
      MEMC_RETURN_IF_ERROR(after_autodiff(module, first_node, backward_begin, static_cast<NodeId>(module.nodes().size())));
    }
    for (size_t p = 0; p < params.size(); ++p) {
      module.rename(grads[p], prefix + module.value(grads[p]).name);
      // The running sum has the parameter's dtype, as PyTorch's .grad: f32 under fp32 and the
      // mixed modes (f32 master weights), 16-bit under the -true modes.
      const ValueId g = cast(module, grads[p], module.value(params[p]).type.dtype);
      module.value(g).role = Role::kGrad;  // the memory breakdown counts accumulators as gradients
      if (sums[p] == kNoValue) {
        sums[p] = g;
      } else {
        sums[p] = emit(module, "add", {sums[p], g});
        module.value(sums[p]).role = Role::kGrad;
        accumulations.push_back(module.value(sums[p]).producer);
      }
    }
    step.loss = step.loss == kNoValue ? weighted : emit(module, "add", {step.loss, weighted});
    logits.push_back(outs[0]);
    first += n;
  }
  for (size_t p = 0; p < params.size(); ++p) {
    ValueId g = cast(module, sums[p], module.value(params[p]).type.dtype);
    if (g == params[p] || module.value(g).producer == kNoNode) g = emit(module, "copy", {g});
    module.value(g).role = Role::kGrad;
    module.rename(g, "grad." + module.value(params[p]).name);
    step.grads.push_back(g);
  }
  step.logits = logits.size() == 1 ? logits[0] : emit(module, "concat", logits, make_attrs({{"axis", int64_t{0}}}));

  // Each accumulation runs right after the gradient it adds is complete.
  std::vector<NodeId> order = module.schedule();
  std::vector<bool> is_acc(module.nodes().size(), false);
  for (NodeId a : accumulations) is_acc[a] = true;
  std::map<NodeId, std::vector<NodeId>> after;  // producer of the added gradient → its adds
  for (NodeId a : accumulations) {
    // The add reads the gradient or its f32 cast.
    after[module.value(module.node(a).inputs[1]).producer].push_back(a);
  }
  std::vector<NodeId> reordered;
  for (NodeId n : order) {
    if (is_acc[n]) continue;
    reordered.push_back(n);
    if (auto it = after.find(n); it != after.end()) {
      for (NodeId a : it->second) reordered.push_back(a);
    }
  }
  module.set_schedule(reordered);
  return step;
}

}  // namespace memc
