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

// Calls `each(param name, its type, its first element in the unit's flat buffer)`.
template <typename F>
Status for_each_param(const ShardLayout::Unit& unit, const std::map<std::string, TensorType>& types, F&& each) {
  int64_t offset = 0;
  for (const std::string& p : unit.params) {
    auto it = types.find(p);
    if (it == types.end()) return Status::BadInput(str_cat("shard layout names parameter '", p, "', which the step does not have"));
    MEMC_RETURN_IF_ERROR(each(p, it->second, offset));
    offset += it->second.numel();
  }
  return Status::Ok();
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
    const int64_t block = sharded.unit->block;
    Tensor flat = Tensor::zeros(tensor.dtype(), {block * layout.devices});
    if (comm) {
      MEMC_RETURN_IF_ERROR(comm->all_gather(tensor.raw(), flat.raw(), block, tensor.dtype()));
    } else if (layout.devices == 1) {
      std::memcpy(flat.raw(), tensor.raw(), tensor.nbytes());
    } else {
      return Status::Internal(str_cat(name, ": consolidating ", layout.devices, " ranks' states needs their communicator"));
    }
    const int64_t elem = static_cast<int64_t>(dtype_size(tensor.dtype()));
    MEMC_RETURN_IF_ERROR(for_each_param(*sharded.unit, types, [&](const std::string& p, const TensorType& t, int64_t offset) {
      Tensor part = Tensor::zeros(tensor.dtype(), t.shape);
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
    MEMC_RETURN_IF_ERROR(for_each_param(*sharded.unit, types, [&](const std::string& p, const TensorType& t, int64_t) {
      out[consolidated_name(sharded, p)] = Tensor::zeros(tensor.dtype(), t.shape);
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
    const int64_t block = sharded.unit->block;
    Tensor flat = Tensor::zeros(view.dtype(), {block * layout.devices});  // zero padding
    const int64_t elem = static_cast<int64_t>(dtype_size(view.dtype()));
    MEMC_RETURN_IF_ERROR(for_each_param(*sharded.unit, types, [&](const std::string& p, const TensorType&, int64_t offset) {
      const Tensor& part = consolidated.at(consolidated_name(sharded, p));
      std::memcpy(static_cast<char*>(flat.raw()) + offset * elem, part.raw(), part.nbytes());
      return Status::Ok();
    }));
    MEMC_RETURN_IF_ERROR(backend.copy(view.raw(), static_cast<const char*>(flat.raw()) + rank * block * elem, block * elem));
  }
  return Status::Ok();
}

Expected<Tensor> parameter_block(const Plan& plan, const std::string& unit, const StateMap& params, int rank) {
  MEMC_ASSIGN_OR_RETURN(const ShardLayout layout, shard_layout(plan.train));
  const ShardedName sharded = parse_name(unit, layout);
  if (!sharded.unit || !sharded.prefix.empty()) return Status::Internal(unit + " is not a unit of sharded parameters");
  const int64_t block = sharded.unit->block;
  const DType dtype = params.at(sharded.unit->params.front()).dtype();
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  Tensor flat = Tensor::zeros(dtype, {block * layout.devices});
  MEMC_RETURN_IF_ERROR(for_each_param(*sharded.unit, param_types(plan), [&](const std::string& p, const TensorType&, int64_t offset) {
    const Tensor& part = params.at(p);
    std::memcpy(static_cast<char*>(flat.raw()) + offset * elem, part.raw(), part.nbytes());
    return Status::Ok();
  }));
  Tensor mine = Tensor::zeros(dtype, {block});
  std::memcpy(mine.raw(), static_cast<const char*>(flat.raw()) + rank * block * elem, mine.nbytes());
  return mine;
}

}  // namespace memc
