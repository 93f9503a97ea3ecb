// Parser half of the text form (syntax in printer.h). A hand-written, non-recursive descent
// over the bytes: every read is bounds-checked, numbers go through from_chars (no exceptions),
// and the first error stops the parse with "line:column: what was expected, what was found".
#include <algorithm>
#include <charconv>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "ir/printer.h"

namespace memc {
namespace {

// Bounds that keep byte counts far from int64 overflow whatever a pass later multiplies.
constexpr int64_t kMaxDim = kMaxTextDim;
constexpr int64_t kMaxElements = kMaxTextElements;
constexpr size_t kMaxRank = kMaxTextRank;

using AttrList = std::vector<std::pair<std::string, Attr>>;

bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}
  Expected<Module> run();

 private:
  // --- lexical helpers -------------------------------------------------------------------
  char at(size_t offset = 0) const { return pos_ + offset < text_.size() ? text_[pos_ + offset] : '\0'; }
  bool at_end() const { return pos_ >= text_.size(); }
  void skip_ws();
  bool fail(const std::string& expected);
  bool consume(char c) {
    skip_ws();
    if (at_end() || at() != c) return false;
    ++pos_;
    return true;
  }
  bool expect(char c, const char* context) { return consume(c) || fail(str_cat("'", c, "' ", context)); }
  bool consume_word(std::string_view word);
  bool expect_word(std::string_view word, const char* context) {
    return consume_word(word) || fail(str_cat("'", word, "' ", context));
  }
  bool parse_bare_id(std::string& out, const char* what);
  bool parse_string(std::string& out, const char* what);
  bool parse_value_name(std::string& out);
  bool parse_int(int64_t& out);
  bool parse_number(Attr& out);
  bool parse_double(double& out);
  bool parse_type(TensorType& out);
  bool parse_type_list(std::vector<TensorType>& out, const char* what);
  bool parse_dense(Attr& out);
  bool parse_array(Attr& out);
  bool parse_string_list(Attr& out);
  bool parse_attr_value(Attr& out);
  bool parse_attr_dict(AttrList& out);
  bool parse_value_use(ValueId& out, TensorType* type = nullptr);
  bool define_value_name(std::string& name);  // parses %name, which must be new
  // --- structure -------------------------------------------------------------------------
  bool parse_signature();
  bool parse_argument();
  bool parse_operation();
  bool parse_return();
  bool apply_reserved(AttrList& attrs, size_t num_operands, size_t num_results, std::vector<ValueId>& inputs,
                      std::vector<Role>& roles, std::vector<MemSpace>& spaces, std::string& source);

  std::string_view text_;
  size_t pos_ = 0;
  Status error_;
  Module module_;
  std::unordered_map<std::string, ValueId> values_;  // names defined so far
  std::vector<TensorType> result_types_;              // the signature's
  std::vector<ValueId> result_updates_;               // per result: the argument it updates
};

void Parser::skip_ws() {
  while (!at_end()) {
    const char c = at();
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++pos_;
    } else if (c == '/' && at(1) == '/') {
      while (!at_end() && at() != '\n') ++pos_;
    } else {
      break;
    }
  }
}

bool Parser::fail(const std::string& expected) {
  if (!error_.ok()) return false;
  const size_t end = std::min(pos_, text_.size());
  int line = 1, column = 1;
  for (size_t i = 0; i < end; ++i) {
    if (text_[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  std::string found = "end of input";
  if (end < text_.size()) {
    const unsigned char c = text_[end];
    found = (c >= 0x21 && c < 0x7f) ? str_cat("'", static_cast<char>(c), "'") : str_cat("byte 0x", std::hex, int{c});
  }
  error_ = Status::BadInput(str_cat(line, ":", column, ": expected ", expected, ", found ", found));
  return false;
}

bool Parser::consume_word(std::string_view word) {
  skip_ws();
  if (text_.substr(pos_, word.size()) != word) return false;
  const char next = at(word.size());
  if (is_letter(word.back()) && (is_letter(next) || is_digit(next) || next == '_' || next == '.')) return false;
  pos_ += word.size();
  return true;
}

bool Parser::parse_bare_id(std::string& out, const char* what) {
  skip_ws();
  if (!(is_letter(at()) || at() == '_')) return fail(what);
  const size_t start = pos_;
  while (is_letter(at()) || is_digit(at()) || at() == '_' || at() == '$' || at() == '.') ++pos_;
  out.assign(text_.substr(start, pos_ - start));
  return true;
}

bool Parser::parse_string(std::string& out, const char* what) {
  skip_ws();
  if (at() != '"') return fail(what);
  ++pos_;
  out.clear();
  while (true) {
    if (at_end() || at() == '\n') return fail("closing '\"' of a string");
    const char c = at();
    ++pos_;
    if (c == '"') return true;
    if (c != '\\') {
      out += c;
      continue;
    }
    const char e = at();
    if (e == '"' || e == '\\') {
      out += e;
      ++pos_;
    } else if (e == 'n' || e == 't') {
      out += e == 'n' ? '\n' : '\t';
      ++pos_;
    } else if (hex_value(e) >= 0 && hex_value(at(1)) >= 0) {
      out += static_cast<char>(hex_value(e) * 16 + hex_value(at(1)));
      pos_ += 2;
    } else {
      return fail("an escape (\\\" \\\\ \\n \\t or two hex digits)");
    }
  }
}

// MLIR suffix-id: digits, or [A-Za-z$._-][A-Za-z0-9$._-]*.
bool Parser::parse_value_name(std::string& out) {
  if (!consume('%')) return fail("a value name ('%name')");
  const size_t start = pos_;
  if (is_digit(at())) {
    while (is_digit(at())) ++pos_;
  } else {
    auto ok = [](char c) { return is_letter(c) || is_digit(c) || c == '$' || c == '.' || c == '_' || c == '-'; };
    if (is_digit(at()) || !ok(at())) return fail("a value name after '%'");
    while (ok(at())) ++pos_;
  }
  out.assign(text_.substr(start, pos_ - start));
  return true;
}

bool Parser::parse_int(int64_t& out) {
  skip_ws();
  const bool negative = at() == '-';
  if (negative) ++pos_;
  if (!is_digit(at())) return fail("an integer");
  uint64_t magnitude = 0;
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  while (is_digit(at())) {
    const uint64_t digit = static_cast<uint64_t>(at() - '0');
    if (magnitude > (limit - digit) / 10) return fail("an integer that fits in i64");
    magnitude = magnitude * 10 + digit;
    ++pos_;
  }
  out = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
  return true;
}

// `-12 : i64`, `1.5e-05 : f64` or `0x7FF0000000000000 : f64` (bits of a non-finite double).
bool Parser::parse_number(Attr& out) {
  skip_ws();
  size_t end = pos_ + (at() == '-' ? 1 : 0);
  while (end < text_.size() && is_digit(text_[end])) ++end;
  const bool is_hex = at() == '0' && (at(1) == 'x' || at(1) == 'X');
  const bool is_float = end < text_.size() && (text_[end] == '.' || text_[end] == 'e' || text_[end] == 'E');
  if (!is_hex && !is_float) {
    int64_t v;
    if (!parse_int(v)) return false;
    out = v;
    return expect(':', "after an integer") && expect_word("i64", "after ':' of an integer");
  }
  double v;
  if (!parse_double(v)) return false;
  out = v;
  return expect(':', "after a float") && expect_word("f64", "after ':' of a float");
}

// A decimal float literal, or 0x + 16 hex digits: the bits of a non-finite double.
bool Parser::parse_double(double& out) {
  skip_ws();
  if (at() == '0' && (at(1) == 'x' || at(1) == 'X')) {
    pos_ += 2;
    uint64_t bits = 0;
    int digits = 0;
    for (; hex_value(at()) >= 0 && digits < 17; ++pos_, ++digits) bits = bits << 4 | static_cast<uint64_t>(hex_value(at()));
    if (digits != 16) return fail("16 hex digits of an f64 bit pattern");
    std::memcpy(&out, &bits, 8);
    return true;
  }
  if (!(is_digit(at()) || (at() == '-' && is_digit(at(1))))) return fail("a float literal");
  const char* begin = text_.data() + pos_;
  auto [ptr, ec] = std::from_chars(begin, text_.data() + text_.size(), out);
  if (ec != std::errc() || ptr == begin) return fail("a float literal");
  pos_ = static_cast<size_t>(ptr - text_.data());
  return true;
}

bool Parser::parse_type(TensorType& out) {
  if (!consume_word("tensor")) return fail("a tensor type");
  if (at() != '<') return fail("'<' after 'tensor'");
  ++pos_;
  out.shape.clear();
  int64_t elements = 1;
  while (is_digit(at())) {
    int64_t dim = 0;
    while (is_digit(at())) {
      dim = dim * 10 + (at() - '0');
      if (dim > kMaxDim) return fail(str_cat("a dimension up to ", kMaxDim));
      ++pos_;
    }
    if (dim > 0 && elements > kMaxElements / dim) return fail(str_cat("at most ", kMaxElements, " elements"));
    if (dim > 0) elements *= dim;
    out.shape.push_back(dim);
    if (out.shape.size() > kMaxRank) return fail(str_cat("rank at most ", kMaxRank));
    if (at() != 'x') return fail("'x' after a dimension");
    ++pos_;
  }
  const size_t start = pos_;
  while (is_letter(at()) || is_digit(at())) ++pos_;
  auto dtype = parse_dtype(text_.substr(start, pos_ - start));
  if (!dtype) {
    pos_ = start;
    return fail("an element type (f32, f16, bf16, f64, i64, i32, i1, ui8)");
  }
  out.dtype = *dtype;
  if (at() != '>') return fail("'>' closing a tensor type");
  ++pos_;
  return true;
}

bool Parser::parse_type_list(std::vector<TensorType>& out, const char* what) {
  out.clear();
  if (!expect('(', what)) return false;
  if (consume(')')) return true;
  do {
    out.emplace_back();
    if (!parse_type(out.back())) return false;
  } while (consume(','));
  return expect(')', "closing a type list");
}

// dense<"0xHEX"> : tensor<...>
bool Parser::parse_dense(Attr& out) {
  if (!expect('<', "after 'dense'")) return false;
  std::string hex;
  if (!parse_string(hex, "a hex string \"0x...\" in dense<>")) return false;
  if (!expect('>', "closing dense<") || !expect(':', "before the type of a dense attribute")) return false;
  TensorType type;
  if (!parse_type(type)) return false;
  if (hex.size() < 2 || hex[0] != '0' || (hex[1] != 'x' && hex[1] != 'X') || hex.size() % 2 != 0) {
    return fail("the dense string to be \"0x\" followed by hex byte pairs");
  }
  const int64_t n = type.numel();
  const bool packed = type.dtype == DType::kBool;
  const size_t want = packed ? static_cast<size_t>((n + 7) / 8) : static_cast<size_t>(type.bytes());
  if ((hex.size() - 2) / 2 != want) {
    return fail(str_cat(want, " bytes of dense data for ", type_str(type), " (got ", (hex.size() - 2) / 2, ")"));
  }
  std::string bytes(want, '\0');
  for (size_t i = 0; i < want; ++i) {
    const int hi = hex_value(hex[2 + 2 * i]), lo = hex_value(hex[3 + 2 * i]);
    if (hi < 0 || lo < 0) return fail("hex digits in the dense string");
    bytes[i] = static_cast<char>(hi * 16 + lo);
  }
  Tensor t = Tensor::zeros(type.dtype, type.shape);
  if (packed) {
    auto* dst = static_cast<uint8_t*>(t.raw());
    for (int64_t i = 0; i < n; ++i) dst[i] = (static_cast<uint8_t>(bytes[i / 8]) >> (i % 8)) & 1;
  } else if (want > 0) {
    std::memcpy(t.raw(), bytes.data(), want);
  }
  out = std::move(t);
  return true;
}

// array<i64: 1, 2> | array<i64> | array<f64: 0.5> | array<f64>
bool Parser::parse_array(Attr& out) {
  if (!expect('<', "after 'array'")) return false;
  const bool ints = consume_word("i64");
  if (!ints && !consume_word("f64")) return fail("'i64' or 'f64' in array<>");
  std::vector<int64_t> int_items;
  std::vector<double> float_items;
  if (consume(':')) {
    do {
      if (ints) {
        int64_t v;
        if (!parse_int(v)) return false;
        int_items.push_back(v);
        continue;
      }
      double v;
      if (!parse_double(v)) return false;
      float_items.push_back(v);
    } while (consume(','));
  }
  if (!expect('>', "closing array<")) return false;
  if (ints) out = std::move(int_items);
  else out = std::move(float_items);
  return true;
}

bool Parser::parse_string_list(Attr& out) {
  std::vector<std::string> items;
  if (!consume(']')) {
    do {
      items.emplace_back();
      if (!parse_string(items.back(), "a string in a list")) return false;
    } while (consume(','));
    if (!expect(']', "closing a string list")) return false;
  }
  out = std::move(items);
  return true;
}

bool Parser::parse_attr_value(Attr& out) {
  skip_ws();
  if (at() == '"') {
    std::string s;
    if (!parse_string(s, "a string")) return false;
    out = std::move(s);
    return true;
  }
  if (at() == '-' || is_digit(at())) return parse_number(out);
  if (consume('[')) return parse_string_list(out);
  if (consume_word("array")) return parse_array(out);
  if (consume_word("dense")) return parse_dense(out);
  return fail("an attribute value (number, string, array<>, [strings] or dense<>)");
}

bool Parser::parse_attr_dict(AttrList& out) {
  out.clear();
  if (!expect('{', "opening an attribute dictionary")) return false;
  if (consume('}')) return true;
  std::unordered_set<std::string> seen;
  do {
    std::string key;
    skip_ws();
    if (at() == '"' ? !parse_string(key, "an attribute name") : !parse_bare_id(key, "an attribute name")) return false;
    if (!seen.insert(key).second) return fail(str_cat("attribute '", key, "' only once"));
    if (!expect('=', "after an attribute name")) return false;
    Attr value;
    if (!parse_attr_value(value)) return false;
    out.emplace_back(std::move(key), std::move(value));
  } while (consume(','));
  return expect('}', "closing an attribute dictionary");
}

bool Parser::parse_value_use(ValueId& out, TensorType* type) {
  skip_ws();
  const size_t start = pos_;
  std::string name;
  if (!parse_value_name(name)) return false;
  auto it = values_.find(name);
  if (it == values_.end()) {
    pos_ = start;
    return fail(str_cat("a defined value (%", name, " is not defined above)"));
  }
  out = it->second;
  if (type) *type = module_.value(out).type;
  return true;
}

bool Parser::define_value_name(std::string& name) {
  skip_ws();
  const size_t start = pos_;
  if (!parse_value_name(name)) return false;
  if (!values_.count(name)) return true;
  pos_ = start;
  return fail(str_cat("a new value name (%", name, " is already defined)"));
}

bool Parser::parse_argument() {
  std::string name;
  TensorType type;
  AttrList attrs;
  if (!define_value_name(name) || !expect(':', "after an argument name") || !parse_type(type)) return false;
  skip_ws();
  if (at() == '{' && !parse_attr_dict(attrs)) return false;
  std::optional<Role> role;
  std::string source_name = name;
  MemSpace space = MemSpace::kDevice;
  for (auto& [key, attr] : attrs) {
    const auto* s = std::get_if<std::string>(&attr);
    if (!s) return fail(str_cat("a string for argument attribute ", key));
    if (key == "memc.role") {
      role = parse_role(*s);
      if (!role) return fail(str_cat("a known role, not \"", *s, "\""));
    } else if (key == "memc.name") {
      source_name = *s;
    } else if (key == "memc.space" && (*s == "host" || *s == "device")) {
      space = *s == "host" ? MemSpace::kHost : MemSpace::kDevice;
    } else {
      return fail(str_cat("argument attributes memc.role, memc.name, memc.space = \"host\"|\"device\" (bad ", key, ")"));
    }
  }
  if (!role) return fail(str_cat("memc.role on argument %", name));
  const ValueId id = module_.add_argument(name, type, *role);
  Value& v = module_.value(id);
  if (v.name != name) return fail(str_cat("a value name the IR keeps as is, not %", name));
  v.source_name = source_name;
  v.space = space;
  values_[name] = id;
  return true;
}

// func.func @name(args) -> (types) [attributes {memc.k = v}] {
bool Parser::parse_signature() {
  if (!expect_word("func.func", "at the start of the module")) return false;
  if (!expect('@', "before the function name")) return false;
  std::string symbol;
  if (at() == '"' ? !parse_string(symbol, "a function name") : !parse_bare_id(symbol, "a function name")) return false;
  if (!expect('(', "opening the argument list")) return false;
  if (!consume(')')) {
    do {
      if (!parse_argument()) return false;
    } while (consume(','));
    if (!expect(')', "closing the argument list")) return false;
  }
  if (!consume('-') || at() != '>') return fail("'->' before the result types");
  ++pos_;
  skip_ws();
  if (at() == '(') {
    // (type [{memc.updates = "arg"}], ...): a result may name the argument it replaces.
    ++pos_;
    skip_ws();
    if (!consume(')')) {
      do {
        result_types_.emplace_back();
        result_updates_.push_back(kNoValue);
        if (!parse_type(result_types_.back())) return false;
        skip_ws();
        if (at() == '{') {
          AttrList attrs;
          if (!parse_attr_dict(attrs)) return false;
          for (auto& [key, value] : attrs) {
            const std::string* arg = std::get_if<std::string>(&value);
            if (key != "memc.updates" || !arg) return fail("only memc.updates = \"<argument>\" as a result attribute");
            const ValueId target = module_.find_value(*arg);
            const bool is_arg = target != kNoValue && std::find(module_.arguments().begin(), module_.arguments().end(), target) != module_.arguments().end();
            if (!is_arg) return fail(str_cat("memc.updates to name an argument (got '", *arg, "')"));
            result_updates_.back() = target;
          }
        }
      } while (consume(','));
      if (!expect(')', "closing the result types")) return false;
    }
  } else {
    result_types_.emplace_back();
    if (!parse_type(result_types_.back())) return false;
  }
  if (consume_word("attributes")) {
    AttrList metadata;
    if (!parse_attr_dict(metadata)) return false;
    for (auto& [key, value] : metadata) {
      if (key.rfind("memc.", 0) != 0) return fail(str_cat("metadata names prefixed 'memc.' (got ", key, ")"));
      module_.metadata().set(key.substr(5), std::move(value));
    }
  }
  return expect('{', "opening the function body");
}

// Moves the reserved memc.* attributes into node and value fields.
bool Parser::apply_reserved(AttrList& attrs, size_t num_operands, size_t num_results, std::vector<ValueId>& inputs,
                            std::vector<Role>& roles, std::vector<MemSpace>& spaces, std::string& source) {
  std::vector<ValueId> operands = std::move(inputs);
  std::vector<int64_t> absent;
  for (auto& [key, attr] : attrs) {
    const auto* ints = std::get_if<std::vector<int64_t>>(&attr);
    const auto* strings = std::get_if<std::vector<std::string>>(&attr);
    if (key == kAbsentAttr) {
      if (!ints) return fail(str_cat(kAbsentAttr, " as array<i64: ...>"));
      absent = *ints;
    } else if (key == kResultRolesAttr || key == kResultSpacesAttr) {
      const bool is_roles = key == kResultRolesAttr;
      if (!strings || strings->size() != num_results) return fail(str_cat(key, " as a list of one string per result"));
      for (size_t i = 0; i < num_results; ++i) {
        const std::string& s = (*strings)[i];
        if (is_roles) {
          auto role = parse_role(s);
          if (!role) return fail(str_cat("a known role in ", key, ", not \"", s, "\""));
          roles[i] = *role;
        } else if (s == "host" || s == "device") {
          spaces[i] = s == "host" ? MemSpace::kHost : MemSpace::kDevice;
        } else {
          return fail(str_cat("\"host\" or \"device\" in ", key, ", not \"", s, "\""));
        }
      }
    } else if (key == kSourceAttr) {
      const auto* s = std::get_if<std::string>(&attr);
      if (!s) return fail(str_cat(kSourceAttr, " as a string"));
      source = *s;
    }
  }
  std::erase_if(attrs, [](const auto& kv) {
    return kv.first == kAbsentAttr || kv.first == kResultRolesAttr || kv.first == kResultSpacesAttr || kv.first == kSourceAttr;
  });
  // Interleave kNoValue at the absent slots (strictly increasing, within the full input list).
  const size_t slots = num_operands + absent.size();
  inputs.clear();
  size_t next_operand = 0, next_absent = 0;
  for (size_t slot = 0; slot < slots; ++slot) {
    if (next_absent < absent.size() && absent[next_absent] == static_cast<int64_t>(slot)) {
      inputs.push_back(kNoValue);
      ++next_absent;
    } else if (next_operand < operands.size()) {
      inputs.push_back(operands[next_operand++]);
    }
  }
  if (next_absent != absent.size() || inputs.size() != slots) {
    return fail(str_cat(kAbsentAttr, " slots increasing and below ", slots));
  }
  return true;
}

// %a, %b = "memc.op"(%x, %y) {attrs} : (types) -> type | (types)
bool Parser::parse_operation() {
  std::vector<std::string> names;
  skip_ws();
  if (at() == '%') {
    std::unordered_set<std::string> fresh;
    do {
      names.emplace_back();
      if (!define_value_name(names.back())) return false;
      if (!fresh.insert(names.back()).second) return fail(str_cat("distinct result names (%", names.back(), " twice)"));
    } while (consume(','));
    if (!expect('=', "after the result names")) return false;
  }
  std::string op;
  if (!parse_string(op, "an operation name in quotes")) return false;
  if (op == "func.return" && names.empty()) return parse_return();
  if (op.rfind("memc.", 0) != 0 || op.size() == 5) return fail(str_cat("an op named \"memc.<op>\", not \"", op, "\""));
  std::vector<ValueId> inputs;
  std::vector<TensorType> input_types;
  if (!expect('(', "opening the operand list")) return false;
  if (!consume(')')) {
    do {
      inputs.push_back(kNoValue);
      input_types.emplace_back();
      if (!parse_value_use(inputs.back(), &input_types.back())) return false;
    } while (consume(','));
    if (!expect(')', "closing the operand list")) return false;
  }
  AttrList attrs;
  skip_ws();
  if (at() == '{' && !parse_attr_dict(attrs)) return false;
  std::vector<TensorType> declared, results;
  if (!expect(':', "before the op's function type") || !parse_type_list(declared, "opening the operand types")) return false;
  if (declared.size() != inputs.size()) return fail(str_cat(inputs.size(), " operand types, one per operand"));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (declared[i] != input_types[i]) {
      return fail(str_cat("operand ", i, " to have type ", type_str(input_types[i]), " as defined, not ", type_str(declared[i])));
    }
  }
  if (!consume('-') || at() != '>') return fail("'->' before the result types");
  ++pos_;
  skip_ws();
  if (at() == '(') {
    if (!parse_type_list(results, "")) return false;
  } else {
    results.emplace_back();
    if (!parse_type(results.back())) return false;
  }
  if (results.size() != names.size()) return fail(str_cat(names.size(), " result types, one per result name"));
  const Role default_role = op == "memc.constant" ? Role::kConstant : Role::kActivation;
  std::vector<Role> roles(results.size(), default_role);
  std::vector<MemSpace> spaces(results.size(), MemSpace::kDevice);
  std::string source;
  if (!apply_reserved(attrs, inputs.size(), results.size(), inputs, roles, spaces, source)) return false;
  Attrs node_attrs;
  for (auto& [key, value] : attrs) node_attrs.set(key, std::move(value));
  const NodeId id = module_.add_node_typed(op.substr(5), std::move(inputs), std::move(node_attrs), results, names, source);
  const Node& node = module_.node(id);
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    Value& v = module_.value(node.outputs[i]);
    if (v.name != names[i]) return fail(str_cat("a value name the IR keeps as is, not %", names[i]));
    v.role = roles[i];
    v.space = spaces[i];
    values_[v.name] = v.id;
  }
  return true;
}

// "func.return"(%a) : (types) -> ()   then the closing '}'
bool Parser::parse_return() {
  std::vector<ValueId> outputs;
  std::vector<TensorType> types, declared, none;
  if (!expect('(', "opening the returned values")) return false;
  if (!consume(')')) {
    do {
      outputs.push_back(kNoValue);
      types.emplace_back();
      if (!parse_value_use(outputs.back(), &types.back())) return false;
    } while (consume(','));
    if (!expect(')', "closing the returned values")) return false;
  }
  if (!expect(':', "before the return's function type") || !parse_type_list(declared, "opening the returned types")) return false;
  if (declared != types) return fail("returned types equal to the returned values' types");
  if (types != result_types_) return fail("returned types equal to the function's result types");
  if (!consume('-') || at() != '>') return fail("'->' in the return's function type");
  ++pos_;
  if (!parse_type_list(none, "after '->'")) return false;
  if (!none.empty()) return fail("'()' as the return's result types");
  module_.set_outputs(std::move(outputs));
  for (size_t i = 0; i < result_updates_.size() && i < module_.outputs().size(); ++i) {
    if (result_updates_[i] != kNoValue) module_.set_output_update(i, result_updates_[i]);
  }
  return expect('}', "closing the function body after func.return");
}

Expected<Module> Parser::run() {
  if (parse_signature()) {
    while (true) {
      const size_t nodes = module_.nodes().size();
      skip_ws();
      if (at() == '}') {
        fail("\"func.return\" before the closing '}'");
        break;
      }
      if (!parse_operation()) break;
      if (module_.nodes().size() == nodes) {  // that was func.return and the closing brace
        skip_ws();
        if (!at_end()) fail("end of input after the function");
        break;
      }
    }
  }
  if (!error_.ok()) return error_;
  return std::move(module_);
}

}  // namespace

Expected<Module> parse_module(std::string_view text) {
  try {
    return Parser(text).run();
  } catch (const std::exception& e) {  // only allocation failure can get here
    return Status::BadInput(str_cat("parse_module: ", e.what()));
  }
}

}  // namespace memc
