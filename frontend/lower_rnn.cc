// Recurrent layers (ONNX LSTM, GRU and RNN), unrolled over the sequence. memc imports static
// shapes, so the sequence length is known and each step is a handful of core ops: the input
// projection of every step is one linear over [seq·batch, I] before the steps, and each step
// adds Hₜ₋₁·Rᵀ, applies the gates and carries the state. Autodiff then differentiates the
// unrolled graph (backpropagation through time), and the memory passes see every step's tensors.
//
// Supported: forward, reverse and bidirectional; layout 0 and 1; optional biases, initial
// states and (LSTM) peepholes; GRU's linear_before_reset; the activations Sigmoid, Tanh and Relu.
// Refused in one line: clip, LSTM's input_forget, other activations, and sequence_lens that are
// not all the full length.
#include <string_view>

#include "frontend/lowering.h"

namespace memc {
namespace {

struct RnnSpec {
  std::string_view kind;  // "LSTM", "GRU" or "RNN"
  int64_t gates = 1;      // 4, 3, 1
  int64_t seq = 0, batch = 0, input = 0, hidden = 0, dirs = 1;
  bool batch_first = false;
  bool reverse_only = false;
  bool linear_before_reset = false;
  std::vector<std::string> activations;  // memc op names, per direction: f, g[, h]
};

Expected<ValueId> slice1(ImportContext& ctx, ValueId v, int64_t axis, int64_t start, int64_t end) {
  Attrs a;
  a.set("axes", std::vector<int64_t>{axis}), a.set("starts", std::vector<int64_t>{start}), a.set("ends", std::vector<int64_t>{end});
  a.set("steps", std::vector<int64_t>{1});
  return ctx.emit("slice", {v}, std::move(a));
}

Expected<ValueId> binary(ImportContext& ctx, const char* op, ValueId a, ValueId b) { return ctx.emit(op, {a, b}); }

Expected<ValueId> concat(ImportContext& ctx, std::vector<ValueId> parts, int64_t axis) {
  if (parts.size() == 1) return parts[0];
  Attrs a;
  a.set("axis", axis);
  return ctx.emit("concat", std::move(parts), std::move(a));
}

// Attributes and shapes, with every refusal.
Expected<RnnSpec> rnn_spec(ImportContext& ctx, ValueId x, ValueId w) {
  RnnSpec s;
  s.kind = ctx.op_type();
  s.gates = s.kind == "LSTM" ? 4 : s.kind == "GRU" ? 3 : 1;
  const Shape& xs = ctx.type(x).shape;
  const Shape& ws = ctx.type(w).shape;
  s.batch_first = ctx.attr_int("layout", 0) == 1;
  if (xs.size() != 3 || ws.size() != 3) return ctx.error("needs X [seq, batch, input] and W [directions, gates·hidden, input]");
  s.seq = xs[s.batch_first ? 1 : 0], s.batch = xs[s.batch_first ? 0 : 1], s.input = xs[2];
  s.hidden = ctx.attr_int("hidden_size", ws[1] / s.gates);
  const std::string direction = ctx.attr_string("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") return ctx.error("direction '" + direction + "' is unknown");
  s.dirs = direction == "bidirectional" ? 2 : 1;
  s.reverse_only = direction == "reverse";
  if (ws[0] != s.dirs || ws[1] != s.gates * s.hidden || ws[2] != s.input || s.seq <= 0) {
    return ctx.error(str_cat("W ", shape_str(ws), " does not match ", s.dirs, " direction(s), hidden ", s.hidden, " and input ", s.input));
  }
  if (ctx.has_attr("clip")) return ctx.error("clip is unsupported: memc lowers unclipped cells");
  if (ctx.attr_int("input_forget", 0) != 0) return ctx.error("input_forget is unsupported");
  s.linear_before_reset = ctx.attr_int("linear_before_reset", 0) != 0;
  const std::vector<std::string> defaults = s.kind == "LSTM" ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                            : s.kind == "GRU" ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                              : std::vector<std::string>{"Tanh"};
  std::vector<std::string> names;
  if (const onnx::AttributeProto* a = ctx.attr("activations")) names.assign(a->strings().begin(), a->strings().end());
  while (names.size() < defaults.size() * static_cast<size_t>(s.dirs)) names.insert(names.end(), defaults.begin(), defaults.end());
  if (names.size() != defaults.size() * static_cast<size_t>(s.dirs)) return ctx.error(str_cat(names.size(), " activations for ", s.dirs, " direction(s)"));
  if (ctx.has_attr("activation_alpha") || ctx.has_attr("activation_beta")) return ctx.error("activation_alpha/beta are unsupported");
  for (const std::string& n : names) {
    if (n != "Sigmoid" && n != "Tanh" && n != "Relu") return ctx.error("activation " + n + " is unsupported: memc lowers Sigmoid, Tanh and Relu");
    s.activations.push_back(n == "Sigmoid" ? "sigmoid" : n == "Tanh" ? "tanh" : "relu");
  }
  if (ctx.has_input(4)) {  // sequence_lens: only the full length for every row
    const Tensor* lens = ctx.input_constant(4);
    bool full = lens != nullptr;
    for (int64_t i = 0; full && i < lens->numel(); ++i) full = lens->get_as_int(i) == s.seq;
    if (!full) return ctx.error("sequence_lens shorter than the sequence, or given at run time, are unsupported: memc runs every row to the full length");
  }
  return s;
}

// One direction's [gates·hidden, K] matrix of W or R, its [gates·hidden] bias halves, and the
// pieces the steps read, sliced once for every step: GRU's R and Rb split at the h gate, LSTM's
// peepholes (i, o, f).
struct DirectionWeights {
  ValueId w = kNoValue, r = kNoValue, wb = kNoValue, rb = kNoValue;
  ValueId r_zr = kNoValue, r_h = kNoValue, rb_zr = kNoValue, rb_h = kNoValue;
  ValueId p_i = kNoValue, p_o = kNoValue, p_f = kNoValue;
};

Expected<DirectionWeights> direction_weights(ImportContext& ctx, const RnnSpec& s, int64_t d) {
  const int64_t gh = s.gates * s.hidden;
  DirectionWeights dw;
  MEMC_ASSIGN_OR_RETURN(ValueId w, ctx.input(1));
  MEMC_ASSIGN_OR_RETURN(ValueId r, ctx.input(2));
  MEMC_ASSIGN_OR_RETURN(dw.w, slice1(ctx, w, 0, d, d + 1));
  MEMC_ASSIGN_OR_RETURN(dw.w, ctx.reshape(dw.w, {gh, s.input}));
  MEMC_ASSIGN_OR_RETURN(dw.r, slice1(ctx, r, 0, d, d + 1));
  MEMC_ASSIGN_OR_RETURN(dw.r, ctx.reshape(dw.r, {gh, s.hidden}));
  if (ctx.has_input(3)) {
    MEMC_ASSIGN_OR_RETURN(ValueId b, ctx.input(3));
    MEMC_ASSIGN_OR_RETURN(b, slice1(ctx, b, 0, d, d + 1));
    MEMC_ASSIGN_OR_RETURN(b, ctx.reshape(b, {2 * gh}));
    MEMC_ASSIGN_OR_RETURN(dw.wb, slice1(ctx, b, 0, 0, gh));
    MEMC_ASSIGN_OR_RETURN(dw.rb, slice1(ctx, b, 0, gh, 2 * gh));
  }
  const int64_t hs = s.hidden;
  if (s.kind == "LSTM" && ctx.has_input(7)) {
    MEMC_ASSIGN_OR_RETURN(ValueId p, ctx.input(7));
    MEMC_ASSIGN_OR_RETURN(p, slice1(ctx, p, 0, d, d + 1));
    MEMC_ASSIGN_OR_RETURN(p, ctx.reshape(p, {3 * hs}));
    MEMC_ASSIGN_OR_RETURN(dw.p_i, slice1(ctx, p, 0, 0, hs));
    MEMC_ASSIGN_OR_RETURN(dw.p_o, slice1(ctx, p, 0, hs, 2 * hs));
    MEMC_ASSIGN_OR_RETURN(dw.p_f, slice1(ctx, p, 0, 2 * hs, 3 * hs));
  }
  if (s.kind == "GRU") {
    MEMC_ASSIGN_OR_RETURN(dw.r_zr, slice1(ctx, dw.r, 0, 0, 2 * hs));
    MEMC_ASSIGN_OR_RETURN(dw.r_h, slice1(ctx, dw.r, 0, 2 * hs, 3 * hs));
    if (dw.rb != kNoValue) {
      MEMC_ASSIGN_OR_RETURN(dw.rb_zr, slice1(ctx, dw.rb, 0, 0, 2 * hs));
      MEMC_ASSIGN_OR_RETURN(dw.rb_h, slice1(ctx, dw.rb, 0, 2 * hs, 3 * hs));
    }
  }
  return dw;
}

// Direction d's initial state (input `index`: initial_h or initial_c) as [batch, hidden], zeros when absent.
Expected<ValueId> initial_state(ImportContext& ctx, const RnnSpec& s, int index, int64_t d, DType dtype) {
  if (!ctx.has_input(index)) return ctx.constant(Tensor::zeros(dtype, {s.batch, s.hidden}), "rnn_zeros");
  MEMC_ASSIGN_OR_RETURN(ValueId h, ctx.input(index));
  MEMC_ASSIGN_OR_RETURN(h, slice1(ctx, h, s.batch_first ? 1 : 0, d, d + 1));
  return ctx.reshape(h, {s.batch, s.hidden});
}

Expected<ValueId> linear(ImportContext& ctx, ValueId x, ValueId w, ValueId b) {
  Attrs a;
  a.set("transpose_w", int64_t{1});
  std::vector<ValueId> inputs = {x, w};
  if (b != kNoValue) inputs.push_back(b);
  return ctx.emit("linear", std::move(inputs), std::move(a));
}

struct State {
  ValueId h = kNoValue, c = kNoValue;
};

// One LSTM step from the step's projected input and the state before it (ONNX's equations, gates i, o, f, c).
Expected<State> lstm_step(ImportContext& ctx, const RnnSpec& s, const DirectionWeights& dw, const std::string* act, ValueId projected,
                          const State& prev) {
  const int64_t hs = s.hidden;
  MEMC_ASSIGN_OR_RETURN(ValueId rec, linear(ctx, prev.h, dw.r, dw.rb));
  MEMC_ASSIGN_OR_RETURN(ValueId gates, binary(ctx, "add", projected, rec));
  auto gate = [&](int64_t k) { return slice1(ctx, gates, 1, k * hs, (k + 1) * hs); };
  auto peephole = [&](ValueId pre, ValueId pk, ValueId c) -> Expected<ValueId> {
    if (pk == kNoValue) return pre;
    MEMC_ASSIGN_OR_RETURN(ValueId term, binary(ctx, "mul", pk, c));
    return binary(ctx, "add", pre, term);
  };
  MEMC_ASSIGN_OR_RETURN(ValueId i, gate(0));
  MEMC_ASSIGN_OR_RETURN(ValueId o, gate(1));
  MEMC_ASSIGN_OR_RETURN(ValueId f, gate(2));
  MEMC_ASSIGN_OR_RETURN(ValueId g, gate(3));
  MEMC_ASSIGN_OR_RETURN(i, peephole(i, dw.p_i, prev.c));
  MEMC_ASSIGN_OR_RETURN(f, peephole(f, dw.p_f, prev.c));
  MEMC_ASSIGN_OR_RETURN(i, ctx.emit(act[0], {i}));
  MEMC_ASSIGN_OR_RETURN(f, ctx.emit(act[0], {f}));
  MEMC_ASSIGN_OR_RETURN(g, ctx.emit(act[1], {g}));
  MEMC_ASSIGN_OR_RETURN(ValueId keep, binary(ctx, "mul", f, prev.c));
  MEMC_ASSIGN_OR_RETURN(ValueId add, binary(ctx, "mul", i, g));
  State next;
  MEMC_ASSIGN_OR_RETURN(next.c, binary(ctx, "add", keep, add));
  MEMC_ASSIGN_OR_RETURN(o, peephole(o, dw.p_o, next.c));
  MEMC_ASSIGN_OR_RETURN(o, ctx.emit(act[0], {o}));
  MEMC_ASSIGN_OR_RETURN(ValueId squashed, ctx.emit(act[2], {next.c}));
  MEMC_ASSIGN_OR_RETURN(next.h, binary(ctx, "mul", o, squashed));
  return next;
}

// One GRU step (gates z, r, h): Hₜ = (1 − z)·h̃ + z·Hₜ₋₁.
Expected<State> gru_step(ImportContext& ctx, const RnnSpec& s, const DirectionWeights& dw, const std::string* act, ValueId projected,
                         const State& prev) {
  const int64_t hs = s.hidden;
  MEMC_ASSIGN_OR_RETURN(ValueId rec, linear(ctx, prev.h, dw.r_zr, dw.rb_zr));
  MEMC_ASSIGN_OR_RETURN(ValueId x_zr, slice1(ctx, projected, 1, 0, 2 * hs));
  MEMC_ASSIGN_OR_RETURN(ValueId zr, binary(ctx, "add", x_zr, rec));
  MEMC_ASSIGN_OR_RETURN(zr, ctx.emit(act[0], {zr}));
  MEMC_ASSIGN_OR_RETURN(ValueId z, slice1(ctx, zr, 1, 0, hs));
  MEMC_ASSIGN_OR_RETURN(ValueId r, slice1(ctx, zr, 1, hs, 2 * hs));
  ValueId h_rec = kNoValue;
  if (s.linear_before_reset) {
    MEMC_ASSIGN_OR_RETURN(h_rec, linear(ctx, prev.h, dw.r_h, dw.rb_h));
    MEMC_ASSIGN_OR_RETURN(h_rec, binary(ctx, "mul", r, h_rec));
  } else {
    MEMC_ASSIGN_OR_RETURN(ValueId reset, binary(ctx, "mul", r, prev.h));
    MEMC_ASSIGN_OR_RETURN(h_rec, linear(ctx, reset, dw.r_h, dw.rb_h));
  }
  MEMC_ASSIGN_OR_RETURN(ValueId x_h, slice1(ctx, projected, 1, 2 * hs, 3 * hs));
  MEMC_ASSIGN_OR_RETURN(ValueId h, binary(ctx, "add", x_h, h_rec));
  MEMC_ASSIGN_OR_RETURN(h, ctx.emit(act[1], {h}));
  // (1 − z)·h̃ + z·Hₜ₋₁ = h̃ + z·(Hₜ₋₁ − h̃)
  MEMC_ASSIGN_OR_RETURN(ValueId delta, binary(ctx, "sub", prev.h, h));
  MEMC_ASSIGN_OR_RETURN(delta, binary(ctx, "mul", z, delta));
  State next;
  MEMC_ASSIGN_OR_RETURN(next.h, binary(ctx, "add", h, delta));
  return next;
}

// One direction over the whole sequence: Y [seq, 1, batch, hidden] and the final state.
struct DirectionResult {
  ValueId y = kNoValue;
  State last;
};

Expected<DirectionResult> run_direction(ImportContext& ctx, const RnnSpec& s, ValueId x_seq_first, int64_t d) {
  MEMC_ASSIGN_OR_RETURN(const DirectionWeights dw, direction_weights(ctx, s, d));
  const DType dtype = ctx.type(x_seq_first).dtype;
  const bool reverse = s.reverse_only || d == 1;
  const std::string* act = &s.activations[static_cast<size_t>(d) * (s.activations.size() / s.dirs)];
  // Every step's input projection at once (GRU's and RNN's recurrent biases stay in the steps).
  MEMC_ASSIGN_OR_RETURN(ValueId flat, ctx.reshape(x_seq_first, {s.seq * s.batch, s.input}));
  MEMC_ASSIGN_OR_RETURN(ValueId projected, linear(ctx, flat, dw.w, dw.wb));
  MEMC_ASSIGN_OR_RETURN(projected, ctx.reshape(projected, {s.seq, s.batch, s.gates * s.hidden}));
  State state;
  MEMC_ASSIGN_OR_RETURN(state.h, initial_state(ctx, s, 5, d, dtype));
  if (s.kind == "LSTM") {
    MEMC_ASSIGN_OR_RETURN(state.c, initial_state(ctx, s, 6, d, dtype));
  }
  std::vector<ValueId> outputs(static_cast<size_t>(s.seq));
  for (int64_t k = 0; k < s.seq; ++k) {
    const int64_t t = reverse ? s.seq - 1 - k : k;
    MEMC_ASSIGN_OR_RETURN(ValueId step_in, slice1(ctx, projected, 0, t, t + 1));
    MEMC_ASSIGN_OR_RETURN(step_in, ctx.reshape(step_in, {s.batch, s.gates * s.hidden}));
    if (s.kind == "LSTM") {
      MEMC_ASSIGN_OR_RETURN(state, lstm_step(ctx, s, dw, act, step_in, state));
    } else if (s.kind == "GRU") {
      MEMC_ASSIGN_OR_RETURN(state, gru_step(ctx, s, dw, act, step_in, state));
    } else {
      MEMC_ASSIGN_OR_RETURN(ValueId rec, linear(ctx, state.h, dw.r, dw.rb));
      MEMC_ASSIGN_OR_RETURN(ValueId pre, binary(ctx, "add", step_in, rec));
      MEMC_ASSIGN_OR_RETURN(state.h, ctx.emit(act[0], {pre}));
    }
    MEMC_ASSIGN_OR_RETURN(outputs[static_cast<size_t>(t)], ctx.reshape(state.h, {1, 1, s.batch, s.hidden}));
  }
  DirectionResult r;
  MEMC_ASSIGN_OR_RETURN(r.y, concat(ctx, outputs, 0));
  r.last = state;
  return r;
}

// [dirs, batch, hidden] of the final states (layout 1: [batch, dirs, hidden]).
Expected<ValueId> final_states(ImportContext& ctx, const RnnSpec& s, const std::vector<ValueId>& per_direction) {
  std::vector<ValueId> parts;
  for (ValueId v : per_direction) {
    MEMC_ASSIGN_OR_RETURN(ValueId p, ctx.reshape(v, {1, s.batch, s.hidden}));
    parts.push_back(p);
  }
  MEMC_ASSIGN_OR_RETURN(ValueId all, concat(ctx, parts, 0));
  return s.batch_first ? ctx.transpose(all, {1, 0, 2}) : all;
}

Status lower_rnn(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId w, ctx.input(1));
  MEMC_ASSIGN_OR_RETURN(const RnnSpec s, rnn_spec(ctx, x, w));
  if (s.batch_first) {
    MEMC_ASSIGN_OR_RETURN(x, ctx.transpose(x, {1, 0, 2}));
  }
  std::vector<ValueId> ys, hs, cs;
  for (int64_t d = 0; d < s.dirs; ++d) {
    MEMC_ASSIGN_OR_RETURN(const DirectionResult r, run_direction(ctx, s, x, d));
    ys.push_back(r.y), hs.push_back(r.last.h), cs.push_back(r.last.c);
  }
  if (ctx.has_output(0)) {  // Y [seq, dirs, batch, hidden], layout 1: [batch, seq, dirs, hidden]
    MEMC_ASSIGN_OR_RETURN(ValueId y, concat(ctx, ys, 1));
    if (s.batch_first) {
      MEMC_ASSIGN_OR_RETURN(y, ctx.transpose(y, {2, 0, 1, 3}));
    }
    MEMC_RETURN_IF_ERROR(ctx.bind(0, y));
  }
  if (ctx.has_output(1)) {
    MEMC_ASSIGN_OR_RETURN(const ValueId h, final_states(ctx, s, hs));
    MEMC_RETURN_IF_ERROR(ctx.bind(1, h));
  }
  if (s.kind == "LSTM" && ctx.has_output(2)) {
    MEMC_ASSIGN_OR_RETURN(const ValueId c, final_states(ctx, s, cs));
    MEMC_RETURN_IF_ERROR(ctx.bind(2, c));
  }
  return Status::Ok();
}

}  // namespace

void add_rnn_lowerings(LoweringTable& table) {
  table["LSTM"] = lower_rnn;
  table["GRU"] = lower_rnn;
  table["RNN"] = lower_rnn;
}

}  // namespace memc
