// Printer half of the text form; the syntax is described in printer.h.
#include "ir/printer.h"

#include <charconv>
#include <cmath>
#include <cstring>

namespace memc {
namespace {

bool is_bare_id(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '.')) return false;
  }
  return true;
}

std::string attr_key(std::string_view key) { return is_bare_id(key) ? std::string(key) : quote_string(key); }

// Shortest digits that read back to the same double, always with a '.' as MLIR requires.
// Non-finite values have no MLIR decimal spelling, so they print as their bits in hex.
std::string format_double(double v) {
  if (!std::isfinite(v)) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(bits));
    return buf;
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, end);
  if (s.find('.') == std::string::npos) {
    const size_t e = s.find('e');
    s.insert(e == std::string::npos ? s.size() : e, ".0");
  }
  return s;
}

std::string hex_bytes(const Tensor& t) {
  static const char kDigits[] = "0123456789ABCDEF";
  std::string bytes;
  if (t.dtype() == DType::kBool) {  // MLIR stores i1 bit-packed
    bytes.assign((t.numel() + 7) / 8, '\0');
    const auto* src = static_cast<const uint8_t*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (src[i]) bytes[i / 8] = static_cast<char>(bytes[i / 8] | (1 << (i % 8)));
    }
  } else if (t.nbytes() > 0) {
    bytes.assign(static_cast<const char*>(t.raw()), t.nbytes());
  }
  std::string out = "\"0x";
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out + "\"";
}

template <typename T, typename Fn>
std::string join(const std::vector<T>& items, Fn&& fn) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += fn(items[i]);
  }
  return out;
}

bool valid_value(const Module& m, ValueId v) { return v >= 0 && static_cast<size_t>(v) < m.values().size(); }

std::string value_ref(const Module& m, ValueId v) {
  return valid_value(m, v) ? "%" + m.value(v).name : str_cat("%<bad:", v, ">");
}
std::string value_type(const Module& m, ValueId v) {
  return valid_value(m, v) ? type_str(m.value(v).type) : "none";
}

Role default_result_role(const Node& node) { return node.op == "constant" ? Role::kConstant : Role::kActivation; }

// The node's own attributes followed by the reserved ones that encode Node/Value fields.
std::string node_attrs(const Module& m, const Node& node) {
  std::vector<std::string> parts;
  for (const auto& [key, attr] : node.attrs.items()) parts.push_back(attr_key(key) + " = " + print_attr(attr));
  std::vector<int64_t> absent;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (node.inputs[i] == kNoValue) absent.push_back(static_cast<int64_t>(i));
  }
  if (!absent.empty()) parts.push_back(std::string(kAbsentAttr) + " = " + print_attr(absent));
  std::vector<std::string> roles, spaces;
  bool any_role = false, any_space = false;
  for (ValueId v : node.outputs) {
    if (!valid_value(m, v)) continue;
    const Value& value = m.value(v);
    roles.emplace_back(role_name(value.role));
    spaces.emplace_back(space_name(value.space));
    any_role |= value.role != default_result_role(node);
    any_space |= value.space != MemSpace::kDevice;
  }
  if (any_role) parts.push_back(std::string(kResultRolesAttr) + " = " + print_attr(roles));
  if (any_space) parts.push_back(std::string(kResultSpacesAttr) + " = " + print_attr(spaces));
  if (!node.source.empty()) parts.push_back(std::string(kSourceAttr) + " = " + quote_string(node.source));
  if (parts.empty()) return "";
  return " {" + join(parts, [](const std::string& s) { return s; }) + "}";
}

}  // namespace

bool type_fits_text(const TensorType& type) {
  if (type.shape.size() > kMaxTextRank) return false;
  int64_t elements = 1;
  for (int64_t dim : type.shape) {
    if (dim < 0 || dim > kMaxTextDim) return false;
    if (dim > 0 && elements > kMaxTextElements / dim) return false;
    if (dim > 0) elements *= dim;
  }
  return true;
}

std::string quote_string(std::string_view s) {
  static const char kDigits[] = "0123456789ABCDEF";
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += '\\';
      out += kDigits[c >> 4];
      out += kDigits[c & 15];
    }
  }
  return out + "\"";
}

std::string print_attr(const Attr& attr) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          return std::to_string(v) + " : i64";
        } else if constexpr (std::is_same_v<T, double>) {
          return format_double(v) + " : f64";
        } else if constexpr (std::is_same_v<T, std::string>) {
          return quote_string(v);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          if (v.empty()) return "array<i64>";
          return "array<i64: " + join(v, [](int64_t i) { return std::to_string(i); }) + ">";
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          if (v.empty()) return "array<f64>";
          return "array<f64: " + join(v, format_double) + ">";
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          return "[" + join(v, [](const std::string& s) { return quote_string(s); }) + "]";
        } else {
          return "dense<" + hex_bytes(v) + "> : " + type_str(TensorType{v.dtype(), v.shape()});
        }
      },
      attr);
}

std::string print_node(const Module& m, const Node& node) {
  std::string line;
  if (!node.outputs.empty()) {
    line += join(node.outputs, [&](ValueId v) { return value_ref(m, v); }) + " = ";
  }
  std::vector<ValueId> present;
  for (ValueId v : node.inputs) {
    if (v != kNoValue) present.push_back(v);
  }
  line += quote_string("memc." + node.op) + "(" + join(present, [&](ValueId v) { return value_ref(m, v); }) + ")";
  line += node_attrs(m, node);
  line += " : (" + join(present, [&](ValueId v) { return value_type(m, v); }) + ") -> ";
  const std::string results = join(node.outputs, [&](ValueId v) { return value_type(m, v); });
  line += node.outputs.size() == 1 ? results : "(" + results + ")";
  return line;
}

std::string print_module(const Module& m) {
  std::string out = "func.func @main(";
  out += join(m.arguments(), [&](ValueId v) {
    if (!valid_value(m, v)) return value_ref(m, v);
    const Value& value = m.value(v);
    std::string arg = value_ref(m, v) + ": " + type_str(value.type) + " {memc.role = " +
                      quote_string(role_name(value.role)) + ", memc.name = " + quote_string(value.source_name);
    if (value.space == MemSpace::kHost) arg += ", memc.space = \"host\"";
    return arg + "}";
  });
  std::vector<std::string> results;
  for (size_t i = 0; i < m.outputs().size(); ++i) {
    std::string r = value_type(m, m.outputs()[i]);
    const ValueId updated = i < m.output_updates().size() ? m.output_updates()[i] : kNoValue;
    if (updated != kNoValue && valid_value(m, updated)) r += " {memc.updates = " + quote_string(m.value(updated).name) + "}";
    results.push_back(r);
  }
  out += ") -> (" + join(results, [](const std::string& s) { return s; }) + ")";
  if (!m.metadata().items().empty()) {
    std::vector<std::string> parts;
    for (const auto& [key, attr] : m.metadata().items()) parts.push_back(attr_key("memc." + key) + " = " + print_attr(attr));
    out += " attributes {" + join(parts, [](const std::string& s) { return s; }) + "}";
  }
  out += " {\n";
  for (NodeId n : m.schedule()) out += "  " + print_node(m, m.node(n)) + "\n";
  const std::string outs = join(m.outputs(), [&](ValueId v) { return value_ref(m, v); });
  const std::string types = join(m.outputs(), [&](ValueId v) { return value_type(m, v); });
  out += "  \"func.return\"(" + outs + ") : (" + types + ") -> ()\n}\n";
  return out;
}

}  // namespace memc
