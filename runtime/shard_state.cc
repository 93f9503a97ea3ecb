#include "runtime/shard_state.h"

#include <cstring>

#include "backends/comm/communicator.h"

namespace memc {
namespace {

struct ShardedName {
  std::string prefix;                  // the state's kind: "exp_avg", "momentum_buffer"
  const ShardLayout::Unit* unit = nullptr;
};

// "<prefix>.shard.unitK" → its prefix and unit ("shard.unitK": no prefix, the parameters);
// unit nullptr for anything else.
ShardedName parse_name(const std::string& name, const ShardLayout& layout) {
  for (const ShardLayout::Unit& u : layout.units) {
    if (name == u.name) return {"", &u};
    const std::string suffix = "." + u.name;
    if (name.size() > suffix.size() && name.ends_with(suffix)) return {name.substr(0, name.size() - suffix.size()), &u};
  }
  return {};
}

std::string consolidated_name(const ShardedName& s, const std::string& param) {
  return s.prefix.empty() ? param : s.prefix + "." + param;
}

std::map<std::string, TensorType> param_types(const Plan& plan) {
  std::map<std::string, TensorType> types;
  for (ValueId a : plan.eval.arguments()) {
    const Value& v = plan.eval.value(a);
    if (v.role == Role::kParam) types[v.source_name] = v.type;
  }
  return types;
}

// A sharded state's elements per flat element: 1 for a state shaped like the weight, the block
// size for one value per block (adam8bit's absmax: [block / 2048] per rank).
Expected<int64_t> granularity(const ShardLayout& layout, const ShardLayout::Unit& unit, const std::string& name, int64_t per_rank) {
  if (per_rank == unit.block) return 1;
  if (per_rank > 0 && unit.block % per_rank == 0 && layout.align % (unit.block / per_rank) == 0) return unit.block / per_rank;
  return Status::BadInput(str_cat(name, " has ", per_rank, " elements per rank; its unit's block is ", unit.block, " (align ", layout.align, ")"));
}

// Calls `each(param name, its consolidated shape, its first element in the state's flat
// buffer)` for one state of `granularity` flat elements per element (the parameter's shape at
// 1, else one element per started block).
template <typename F>
Status for_each_param(const ShardLayout& layout, const ShardLayout::Unit& unit, const std::map<std::string, TensorType>& types,
                      int64_t granularity, F&& each) {
  std::vector<int64_t> numels;
  for (const std::string& p : unit.params) {
    auto it = types.find(p);
    if (it == types.end()) return Status::BadInput(str_cat("shard layout names parameter '", p, "', which the step does not have"));
    numels.push_back(it->second.numel());
  }
  const std::vector<int64_t> offsets = flat_offsets(numels, layout.align);
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const Shape shape = granularity == 1 ? types.at(unit.params[i]).shape : Shape{(numels[i] + granularity - 1) / granularity};
    MEMC_RETURN_IF_ERROR(each(unit.params[i], shape, offsets[i] / granularity));
  }
  return Status::Ok();
}

// The unit's flat buffer [block × devices / granularity], zero padded, filled with each
// parameter's tensor `part_of(param)` at its flat offset: what every rank's block is cut from.
template <typename PartOf>
Expected<Tensor> flat_unit_buffer(const ShardLayout& layout, const ShardLayout::Unit& unit, DType dtype, int64_t granularity,
                                  const std::map<std::string, TensorType>& types, PartOf&& part_of) {
  Tensor flat = Tensor::zeros(dtype, {unit.block / granularity * layout.devices});
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  MEMC_RETURN_IF_ERROR(for_each_param(layout, unit, types, granularity, [&](const std::string& p, const Shape& shape, int64_t offset) {
    const Tensor& part = part_of(p);
    if (part.shape() != shape || part.dtype() != dtype) return Status::BadInput(str_cat("state of ", p, " is [", shape_str(part.shape()), "], not [", shape_str(shape), "]"));
    std::memcpy(static_cast<char*>(flat.raw()) + offset * elem, part.raw(), part.nbytes());
    return Status::Ok();
  }));
  return flat;
}

}  // namespace

Expected<StateMap> consolidate_state(const Plan& plan, const StateMap& state, comm::Communicator* comm) {
  MEMC_ASSIGN_OR_RETURN(const ShardLayout layout, shard_layout(plan.train));
  const auto types = param_types(plan);
  StateMap out;
  for (const auto& [name, tensor] : state) {  // std::map: the same order on every rank
    const ShardedName sharded = parse_name(name, layout);
    if (!sharded.unit) {
      out[name] = tensor;
      continue;
    }
    MEMC_ASSIGN_OR_RETURN(const int64_t g, granularity(layout, *sharded.unit, name, tensor.numel()));
    const int64_t block = tensor.numel();
    Tensor flat = Tensor::zeros(tensor.dtype(), {block * layout.devices});
    if (comm) {
      MEMC_RETURN_IF_ERROR(comm->all_gather(tensor.raw(), flat.raw(), block, tensor.dtype()));
    } else if (layout.devices == 1) {
      std::memcpy(flat.raw(), tensor.raw(), tensor.nbytes());
    } else {
      return Status::Internal(str_cat(name, ": consolidating ", layout.devices, " ranks' states needs their communicator"));
    }
    const int64_t elem = static_cast<int64_t>(dtype_size(tensor.dtype()));
    MEMC_RETURN_IF_ERROR(for_each_param(layout, *sharded.unit, types, g, [&](const std::string& p, const Shape& shape, int64_t offset) {
      Tensor part = Tensor::zeros(tensor.dtype(), shape);
      std::memcpy(part.raw(), static_cast<const char*>(flat.raw()) + offset * elem, part.nbytes());
      out[consolidated_name(sharded, p)] = std::move(part);
      return Status::Ok();
    }));
  }
  return out;
}

Expected<StateMap> consolidated_template(const Plan& plan, const StateMap& state) {
  MEMC_ASSIGN_OR_RETURN(const ShardLayout layout, shard_layout(plan.train));
  const auto types = param_types(plan);
  StateMap out;
  for (const auto& [name, tensor] : state) {
    const ShardedName sharded = parse_name(name, layout);
    if (!sharded.unit) {
      out[name] = tensor;
      continue;
    }
    MEMC_ASSIGN_OR_RETURN(const int64_t g, granularity(layout, *sharded.unit, name, tensor.numel()));
    MEMC_RETURN_IF_ERROR(for_each_param(layout, *sharded.unit, types, g, [&](const std::string& p, const Shape& shape, int64_t) {
      out[consolidated_name(sharded, p)] = Tensor::zeros(tensor.dtype(), shape);
      return Status::Ok();
    }));
  }
  return out;
}

Status distribute_state(const Plan& plan, const StateMap& consolidated, StateMap& state, int rank, Backend& backend) {
  MEMC_ASSIGN_OR_RETURN(const ShardLayout layout, shard_layout(plan.train));
  const auto types = param_types(plan);
  for (auto& [name, view] : state) {
    const ShardedName sharded = parse_name(name, layout);
    if (!sharded.unit) {
      MEMC_RETURN_IF_ERROR(backend.copy(view.raw(), consolidated.at(name).raw(), static_cast<int64_t>(view.nbytes())));
      continue;
    }
    MEMC_ASSIGN_OR_RETURN(const int64_t g, granularity(layout, *sharded.unit, name, view.numel()));
    MEMC_ASSIGN_OR_RETURN(const Tensor flat, flat_unit_buffer(layout, *sharded.unit, view.dtype(), g, types, [&](const std::string& p) -> const Tensor& {
      return consolidated.at(consolidated_name(sharded, p));
    }));
    MEMC_RETURN_IF_ERROR(backend.copy(view.raw(), static_cast<const char*>(flat.raw()) + rank * view.nbytes(), static_cast<int64_t>(view.nbytes())));
  }
  return Status::Ok();
}

Expected<Tensor> parameter_block(const Plan& plan, const std::string& unit, const StateMap& params, int rank) {
  MEMC_ASSIGN_OR_RETURN(const ShardLayout layout, shard_layout(plan.train));
  const ShardedName sharded = parse_name(unit, layout);
  if (!sharded.unit || !sharded.prefix.empty()) return Status::Internal(unit + " is not a unit of sharded parameters");
  const DType dtype = params.at(sharded.unit->params.front()).dtype();
  MEMC_ASSIGN_OR_RETURN(const Tensor flat, flat_unit_buffer(layout, *sharded.unit, dtype, 1, param_types(plan),
                                                            [&](const std::string& p) -> const Tensor& { return params.at(p); }));
  Tensor mine = Tensor::zeros(dtype, {sharded.unit->block});
  std::memcpy(mine.raw(), static_cast<const char*>(flat.raw()) + rank * mine.nbytes(), mine.nbytes());
  return mine;
}

}  // namespace memc
