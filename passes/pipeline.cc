#include "passes/pipeline.h"

#include <algorithm>

#include "ir/verifier.h"
#include "passes/accumulate_gemm.h"
#include "passes/add_layernorm.h"
#include "passes/bias_grad_gemm.h"
#include "passes/fuse_elementwise.h"
#include "passes/layernorm_bias_grad.h"
#include "passes/layernorm_grad_casts.h"
#include "passes/narrow_transposes.h"
#include "passes/patch_gemm.h"
#include "passes/split_gathers.h"
#include "passes/schedule.h"
#include "passes/strip_dropout.h"
#include "passes/update_grad_casts.h"
#include "support/log.h"
#include "support/size.h"

namespace memc {

void PassReport::set(std::string name, int64_t value) {
  for (PassStatistic& s : statistics) {
    if (s.name == name) {
      s.value = value;
      return;
    }
  }
  statistics.push_back({std::move(name), value});
}

int count_op(const Module& m, std::string_view op) {
  int n = 0;
  for (NodeId id : m.schedule()) n += m.node(id).op == op;
  return n;
}

PassReport rewrite_report(Module& module, std::vector<PassStatistic> statistics, std::string line) {
  PassReport report;
  report.changed = std::any_of(statistics.begin(), statistics.end(), [](const PassStatistic& s) { return s.value != 0; });
  if (report.changed) {
    module.eliminate_dead_nodes();
    module.compact();
  }
  report.statistics = std::move(statistics);
  report.lines.push_back(std::move(line));
  return report;
}

int64_t PassReport::get(std::string_view name, int64_t fallback) const {
  for (const PassStatistic& s : statistics) {
    if (s.name == name) return s.value;
  }
  return fallback;
}

// The registry: one line per pass, in pipeline order.
const std::vector<PassInfo>& registered_passes() {
  using O = const PipelineOptions&;
  static const std::vector<PassInfo> kPasses = {
      {"strip_dropout", "dropout becomes identity (--no-dropout)", PassStage::kForward, [](O o) { return !o.dropout; },
       [](O) -> std::unique_ptr<Pass> { return std::make_unique<StripDropout>(); }},
      {"attention", "MatMul→Softmax→MatMul becomes tiled attention (--attention tiled)", PassStage::kForward,
       [](O o) { return o.attention == AttentionKernel::kTiled; },
       [](O o) -> std::unique_ptr<Pass> { return std::make_unique<AttentionPass>(o.attention_layouts); }},
      {"patch_gemm", "stride-equals-kernel convolutions become patches and one GEMM (GPU targets)", PassStage::kForward,
       [](O o) { return o.patch_gemm; }, [](O) -> std::unique_ptr<Pass> { return std::make_unique<PatchGemm>(); }, true},
      {"gather_transposes", "gathers of a slice a transpose moved read the untransposed tensor (GPU targets)", PassStage::kForward,
       [](O o) { return o.gather_transposes; }, [](O) -> std::unique_ptr<Pass> { return std::make_unique<GatherTransposes>(); }, true},
      {"precision", "retypes the forward for --precision", PassStage::kForward, [](O) { return true; },
       [](O o) -> std::unique_ptr<Pass> { return std::make_unique<Precision>(Precision::Options{.mode = o.precision}); }},
      {"training_step", "loss, autodiff, micro-batching, remat, sharding and the optimizer", PassStage::kTraining, [](O) { return true; },
       [](O o) -> std::unique_ptr<Pass> {
         ShardOptions shard = o.shard;
         shard.stream_params = o.offload == OffloadLevel::kParams;
         return std::make_unique<TrainingStep>(o.optimizer, MicroBatching{.k = o.micro_batches, .forward = o.forward, .loss_chunks = o.loss_chunks}, o.remat, shard);
       }},
      {"concat_gather_grads", "gather gradients that fill every slice of an axis become one concat (GPU targets)",
       PassStage::kTraining, [](O o) { return o.concat_gather_grads; },
       [](O) -> std::unique_ptr<Pass> { return std::make_unique<ConcatGatherGrads>(); }, true},
      {"accumulate_gemm", "a product added into a gradient's sum (loss chunks, micro-batches, tied weights) by its GEMM",
       PassStage::kTraining, [](O) { return true; }, [](O) -> std::unique_ptr<Pass> { return std::make_unique<AccumulateGemm>(); }, true},
      {"bias_grad_gemm", "a linear layer's bias gradient inside its weight-gradient GEMM (GPU targets)", PassStage::kTraining,
       [](O o) { return o.bias_grad_gemm; }, [](O) -> std::unique_ptr<Pass> { return std::make_unique<BiasGradGemm>(); }, true},
      {"update_grad_casts", "a gradient's widening cast inside the optimizer update that reads it (GPU targets)", PassStage::kTraining,
       [](O o) { return o.update_grad_casts; }, [](O) -> std::unique_ptr<Pass> { return std::make_unique<UpdateGradCasts>(); }, true},
      {"offload", "optimizer state and master weights to host memory (--offload)", PassStage::kTraining,
       [](O o) { return o.offload != OffloadLevel::kNone; }, [](O o) -> std::unique_ptr<Pass> { return std::make_unique<Offload>(o.offload); }},
      {"narrow_transposes", "transposes move 16-bit values: casts to 16 bits before them, from 16 bits after (GPU targets)",
       PassStage::kTraining, [](O o) { return o.narrow_transposes; },
       [](O) -> std::unique_ptr<Pass> { return std::make_unique<NarrowTransposes>(); }, true},
      {"add_layernorm", "residual adds inside their layernorm, gradient adds inside layernorm_grad (GPU targets)", PassStage::kTraining,
       [](O o) { return o.add_layernorm; }, [](O) -> std::unique_ptr<Pass> { return std::make_unique<AddLayernorm>(); }, true},
      {"layernorm_bias_grad", "a layernorm's bias gradient inside its layernorm_grad (GPU targets)", PassStage::kTraining,
       [](O o) { return o.layernorm_bias_grad; }, [](O) -> std::unique_ptr<Pass> { return std::make_unique<LayernormBiasGrad>(); }, true},
      {"layernorm_grad_casts", "a layernorm_grad reads its 16-bit dy and writes dx's 16-bit copy, where casts did (GPU targets)",
       PassStage::kTraining, [](O o) { return o.layernorm_grad_casts; },
       [](O) -> std::unique_ptr<Pass> { return std::make_unique<LayernormGradCasts>(); }, true},
      {"fuse_elementwise", "chains of elementwise ops as one kernel each (GPU targets)", PassStage::kTraining,
       [](O o) { return o.fuse_elementwise; }, [](O) -> std::unique_ptr<Pass> { return std::make_unique<FuseElementwise>(); }, true},
      {"schedule", "the node order with the lowest planned peak", PassStage::kTraining, [](O o) { return o.reschedule; },
       [](O o) -> std::unique_ptr<Pass> {
         Schedule::Options options;
         options.group_updates = o.group_updates;
         options.prefetch = o.prefetch;
         return std::make_unique<Schedule>(options);
       }},
  };
  return kPasses;
}

const PassInfo* find_pass(std::string_view name) {
  for (const PassInfo& p : registered_passes()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::vector<std::string> ir_dump_points() {
  std::vector<std::string> names = {"import"};
  for (const PassInfo& p : registered_passes()) names.emplace_back(p.name);
  return names;
}

std::string ir_dump_point_list() {
  std::string list;
  for (const std::string& p : ir_dump_points()) list += (list.empty() ? "" : ", ") + p;
  return list;
}

std::vector<std::pair<std::string, std::string>> optional_rewrites() {
  std::vector<std::pair<std::string, std::string>> rewrites;
  for (const PassInfo& p : registered_passes()) {
    if (p.optional) rewrites.emplace_back(p.name, p.description);
  }
  rewrites.emplace_back("attention_layouts", "attention reads q, k and v where the projections wrote them (the attention pass's layouts)");
  rewrites.emplace_back("group_updates", "consecutive optimizer updates as one launch (the schedule's groups, GPU targets)");
  return rewrites;
}

std::string optional_rewrite_list() {
  std::string list;
  for (const auto& [name, description] : optional_rewrites()) list += (list.empty() ? "" : ", ") + name;
  return list;
}

Status check_disabled_passes(const std::set<std::string>& names, std::string_view where) {
  const auto rewrites = optional_rewrites();
  for (const std::string& name : names) {
    if (std::any_of(rewrites.begin(), rewrites.end(), [&](const auto& r) { return r.first == name; })) continue;
    return Status::BadInput(str_cat(where, ": '", name, "' is not an optional pass; these are: ", optional_rewrite_list()));
  }
  return Status::Ok();
}

std::string ir_dump_banner(std::string_view pass) { return str_cat("// -----// IR Dump After ", pass, " //----- //"); }

PassPipeline PassPipeline::build(PassStage stage, const PipelineOptions& options) {
  PassPipeline pipeline;
  for (const PassInfo& p : registered_passes()) {
    if (p.stage == stage && p.enabled(options) && !options.disabled_passes.contains(std::string(p.name))) pipeline.add(p.create(options));
  }
  return pipeline;
}

std::vector<std::string> PassPipeline::names() const {
  std::vector<std::string> names;
  for (const auto& p : passes_) names.emplace_back(p->name());
  return names;
}

void print_pass_report(const PassReport& report) {
  for (const std::string& line : report.lines) log(1, "pass " + line);
  for (const std::string& w : report.warnings) warn(w);
}

Expected<std::vector<PassReport>> PassPipeline::run(Module& module, const PassInstrumentation& inst) const {
  std::vector<PassReport> reports;
  // A module between passes need not plan: TrainingStep leaves streamed parameters' updates on
  // the device until the offload pass moves them. Its arena is then not reported (-1).
  auto peak = [&](std::string_view when) -> int64_t {
    Expected<int64_t> p = inst.peak(module);
    if (p.ok()) return *p;
    log(2, str_cat("pass ", when, ": the device arena is not measurable here (", p.status().message(), ")"));
    return -1;
  };
  for (const auto& pass : passes_) {
    int64_t before = -1;
    if (inst.peak) before = peak(str_cat("before ", pass->name()));
    MEMC_ASSIGN_OR_RETURN(PassReport report, pass->run(module));
    if (inst.verify) {
      if (Status st = verify(module); !st.ok()) return Status::Internal(str_cat("after pass '", pass->name(), "': ", st.message()));
    }
    report.pass = std::string(pass->name());
    const bool measure = inst.peak && report.peak_before < 0;  // the pass did not measure them itself
    if (measure) {
      report.peak_before = before;
      report.peak_after = peak(str_cat("after ", pass->name()));
    }
    if (inst.report) {
      print_pass_report(report);
      if (measure && report.peak_before >= 0 && report.peak_after >= 0) log(1, str_cat("pass ", pass->name(), ": device arena ", format_size(report.peak_before), " → ", format_size(report.peak_after)));
    }
    if (inst.after_pass) inst.after_pass(pass->name(), module);
    reports.push_back(std::move(report));
  }
  return reports;
}

}  // namespace memc
