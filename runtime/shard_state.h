// Sharded optimizer states (passes/shard.h) to and from the per-parameter layout a one-device
// run keeps: a checkpoint written by N ranks is the same consolidated safetensors file a single
// device writes, so a run resumes on any number of ranks and `memc export` reads it unchanged.
// A unit's state "<state>.shard.unitK" (under zero3 the parameters too: "shard.unitK") is one
// rank's block [block] of the unit's flat buffer; consolidated, it is "<state>.<param>" (the
// parameter itself) with the parameter's shape for each of the unit's parameters, in flat
// order, at the layout's aligned offsets (the padding between and after them is dropped). A
// state with one value per block of the flat buffer (adam8bit's absmax: [block / 2048] per rank)
// consolidates to the per-parameter [⌈numel / 2048⌉] one device keeps. Parameter shapes come from the plan's
// forward pass, which is never sharded.
#pragma once
#include <map>
#include <string>

#include "backends/backend.h"
#include "passes/shard.h"
#include "runtime/plan.h"
#include "runtime/trainer.h"

namespace memc {

// The per-parameter state of the whole job, from this rank's `state` (host tensors): each
// unit's blocks are all-gathered from every rank (collective: every rank calls it). Parameters
// and unsharded states pass through.
Expected<StateMap> consolidate_state(const Plan& plan, const StateMap& state, comm::Communicator* comm);
// Zero tensors with the consolidated names, shapes and dtypes: what a checkpoint must hold.
Expected<StateMap> consolidated_template(const Plan& plan, const StateMap& state);
// Writes this rank's blocks of `consolidated` into `state` (arena views) through `backend`.
Status distribute_state(const Plan& plan, const StateMap& consolidated, StateMap& state, int rank, Backend& backend);
// zero3: this rank's block of unit `unit`'s flat parameters, from the whole parameters `params`.
Expected<Tensor> parameter_block(const Plan& plan, const std::string& unit, const StateMap& params, int rank);

}  // namespace memc
