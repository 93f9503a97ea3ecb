// Einsum → reduce_sum / transpose / reshape / matmul. Handles one or two operands with
// batch, contracted and free letters (the forms attention and BigBird exports write) and
// "..." ellipses; repeated letters within one operand (diagonals) are unsupported.
#include <algorithm>

#include "frontend/lowering.h"

namespace memc {
namespace {

struct Operand {
  ValueId value;
  std::string letters;  // one per dim
};

int64_t dim_of(const ImportContext& ctx, const Operand& op, char letter) {
  return ctx.type(op.value).shape[op.letters.find(letter)];
}

// Expands "..." into upper-case letters, right-aligned across operands.
Status expand_ellipsis(const ImportContext& ctx, std::vector<std::string>& terms, std::string& out,
                       bool explicit_out, const std::vector<ValueId>& values) {
  int max_ell = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    const size_t pos = terms[i].find("...");
    if (pos == std::string::npos) continue;
    const int64_t named = static_cast<int64_t>(terms[i].size()) - 3;
    const int64_t ell = static_cast<int64_t>(ctx.type(values[i]).shape.size()) - named;
    if (ell < 0 || ell > 20) return ctx.error("ellipsis does not match the operand's rank");
    max_ell = std::max<int>(max_ell, static_cast<int>(ell));
    std::string fill;
    for (int64_t k = 0; k < ell; ++k) fill += static_cast<char>('A' + (20 - ell + k));
    terms[i] = terms[i].substr(0, pos) + fill + terms[i].substr(pos + 3);
  }
  std::string all_fill;
  for (int k = 0; k < max_ell; ++k) all_fill += static_cast<char>('A' + (20 - max_ell + k));
  if (explicit_out) {
    const size_t pos = out.find("...");
    if (pos != std::string::npos) out = out.substr(0, pos) + all_fill + out.substr(pos + 3);
  } else {
    // Implicit output: ellipsis dims, then letters used once, alphabetically.
    std::string once;
    for (char c = 'a'; c <= 'z'; ++c) {
      int count = 0;
      for (const auto& t : terms) count += static_cast<int>(std::count(t.begin(), t.end(), c));
      if (count == 1) once += c;
    }
    out = all_fill + once;
  }
  return Status::Ok();
}

// Sums away the letters of `op` that appear in neither `keep1` nor `keep2`.
Status reduce_private(ImportContext& ctx, Operand& op, const std::string& keep1, const std::string& keep2) {
  std::vector<int64_t> axes;
  std::string kept;
  for (size_t i = 0; i < op.letters.size(); ++i) {
    const char c = op.letters[i];
    if (keep1.find(c) == std::string::npos && keep2.find(c) == std::string::npos) axes.push_back(static_cast<int64_t>(i));
    else kept += c;
  }
  if (axes.empty()) return Status::Ok();
  Attrs a;
  a.set("axes", axes);
  a.set("keepdims", int64_t{0});
  MEMC_ASSIGN_OR_RETURN(op.value, ctx.emit("reduce_sum", {op.value}, std::move(a)));
  op.letters = kept;
  return Status::Ok();
}

std::vector<int64_t> perm_to(const std::string& from, const std::string& to) {
  std::vector<int64_t> perm;
  for (char c : to) perm.push_back(static_cast<int64_t>(from.find(c)));
  return perm;
}
bool is_identity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

// Brings operand to `order` (as a transpose) and merges it into `merged` dims.
Expected<ValueId> arrange(ImportContext& ctx, const Operand& op, const std::string& order, const Shape& merged) {
  MEMC_ASSIGN_OR_RETURN(ValueId v, ctx.transpose(op.value, perm_to(op.letters, order)));
  return ctx.reshape(v, merged);
}

int64_t product(const ImportContext& ctx, const Operand& op, const std::string& letters) {
  int64_t p = 1;
  for (char c : letters) p *= dim_of(ctx, op, c);
  return p;
}

Status contract_pair(ImportContext& ctx, Operand a, Operand b, const std::string& out) {
  MEMC_RETURN_IF_ERROR(reduce_private(ctx, a, b.letters, out));
  MEMC_RETURN_IF_ERROR(reduce_private(ctx, b, a.letters, out));
  std::string batch, contract, a_free, b_free;
  for (char c : out) {
    const bool in_a = a.letters.find(c) != std::string::npos, in_b = b.letters.find(c) != std::string::npos;
    if (in_a && in_b) batch += c;
  }
  for (char c : a.letters) {
    const bool in_b = b.letters.find(c) != std::string::npos, in_out = out.find(c) != std::string::npos;
    if (in_b && !in_out) contract += c;
    if (!in_b) a_free += c;
  }
  for (char c : b.letters) {
    if (a.letters.find(c) == std::string::npos) b_free += c;
  }
  for (char c : batch + contract) {
    if (dim_of(ctx, a, c) != dim_of(ctx, b, c)) return ctx.error(str_cat("letter '", c, "' has different sizes in the operands"));
  }
  const int64_t bn = product(ctx, a, batch), m = product(ctx, a, a_free), k = product(ctx, a, contract),
                n = product(ctx, b, b_free);
  auto merged = [&](int64_t x, int64_t y) { return batch.empty() ? Shape{x, y} : Shape{bn, x, y}; };
  // Prefer a transpose flag over a transpose node when the operand's natural order allows it.
  Attrs attrs;
  std::string a_order = batch + a_free + contract;
  Shape a_shape = merged(m, k);
  if (!is_identity(perm_to(a.letters, a_order)) && is_identity(perm_to(a.letters, batch + contract + a_free))) {
    a_order = batch + contract + a_free;
    a_shape = merged(k, m);
    attrs.set("transpose_a", int64_t{1});
  }
  std::string b_order = batch + contract + b_free;
  Shape b_shape = merged(k, n);
  if (!is_identity(perm_to(b.letters, b_order)) && is_identity(perm_to(b.letters, batch + b_free + contract))) {
    b_order = batch + b_free + contract;
    b_shape = merged(n, k);
    attrs.set("transpose_b", int64_t{1});
  }
  MEMC_ASSIGN_OR_RETURN(ValueId av, arrange(ctx, a, a_order, a_shape));
  MEMC_ASSIGN_OR_RETURN(ValueId bv, arrange(ctx, b, b_order, b_shape));
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("matmul", {av, bv}, std::move(attrs)));
  Shape full;
  for (char c : batch + a_free) full.push_back(dim_of(ctx, a, c));
  for (char c : b_free) full.push_back(dim_of(ctx, b, c));
  MEMC_ASSIGN_OR_RETURN(y, ctx.reshape(y, full));
  MEMC_ASSIGN_OR_RETURN(y, ctx.transpose(y, perm_to(batch + a_free + b_free, out)));
  return ctx.bind(0, y);
}

}  // namespace

Status lower_einsum(ImportContext& ctx) {
  std::string eq;
  for (char c : ctx.attr_string("equation", "")) {
    if (c != ' ') eq += c;
  }
  const size_t arrow = eq.find("->");
  const bool explicit_out = arrow != std::string::npos;
  std::string lhs = eq.substr(0, arrow), out = explicit_out ? eq.substr(arrow + 2) : "";
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<int>(terms.size()) != ctx.num_inputs() || terms.size() > 2) {
    return ctx.error("einsum with " + std::to_string(terms.size()) + " operands is unsupported (memc lowers one or two)");
  }
  std::vector<ValueId> values;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    MEMC_ASSIGN_OR_RETURN(ValueId v, ctx.input(i));
    values.push_back(v);
  }
  MEMC_RETURN_IF_ERROR(expand_ellipsis(ctx, terms, out, explicit_out, values));
  for (size_t i = 0; i < terms.size(); ++i) {
    if (terms[i].size() != ctx.type(values[i]).shape.size()) return ctx.error("equation does not match operand ranks");
    for (char c : terms[i]) {
      if (!std::isalpha(static_cast<unsigned char>(c))) return ctx.error("bad equation '" + eq + "'");
      if (std::count(terms[i].begin(), terms[i].end(), c) > 1) return ctx.error("repeated letters in one operand are unsupported");
    }
  }
  for (char c : out) {
    bool found = std::count(out.begin(), out.end(), c) == 1;
    bool used = false;
    for (const auto& t : terms) used = used || t.find(c) != std::string::npos;
    if (!found || !used) return ctx.error("bad output letters in '" + eq + "'");
  }
  if (terms.size() == 1) {
    Operand a{values[0], terms[0]};
    MEMC_RETURN_IF_ERROR(reduce_private(ctx, a, out, ""));
    MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.transpose(a.value, perm_to(a.letters, out)));
    if (y == values[0]) { MEMC_ASSIGN_OR_RETURN(y, ctx.emit("copy", {y})); }
    return ctx.bind(0, y);
  }
  return contract_pair(ctx, Operand{values[0], terms[0]}, Operand{values[1], terms[1]}, out);
}

}  // namespace memc
