#include "ir/attention_layout.h"

namespace memc {

Expected<AttentionLayout> attention_layout(const Attrs& attrs) {
  const std::string name = attrs.get_string("layout", "bhtd");
  if (name == "bhtd") return AttentionLayout::kBHTD;
  if (name == "bthd") return AttentionLayout::kBTHD;
  if (name == "tbhd") return AttentionLayout::kTBHD;
  return Status::BadInput(str_cat("attention layout '", name, "': bhtd, bthd or tbhd"));
}

std::string_view attention_layout_name(AttentionLayout layout) {
  switch (layout) {
    case AttentionLayout::kBTHD:
      return "bthd";
    case AttentionLayout::kTBHD:
      return "tbhd";
    default:
      return "bhtd";
  }
}

Expected<AttentionOperand> attention_operand(AttentionLayout layout, const Shape& s) {
  if (layout == AttentionLayout::kBHTD) {
    if (s.size() < 2) return Status::BadInput("attention operands need rank ≥ 2");
    return AttentionOperand{Shape(s.begin(), s.end() - 2), s[s.size() - 2], s.back()};
  }
  if (s.size() != 4) return Status::BadInput(str_cat("attention layout ", attention_layout_name(layout), " needs rank-4 operands"));
  if (layout == AttentionLayout::kBTHD) return AttentionOperand{{s[0], s[2]}, s[1], s[3]};
  return AttentionOperand{{s[1], s[2]}, s[0], s[3]};
}

AttentionLayout attention_layout_of(const Attrs& attrs) {
  const Expected<AttentionLayout> layout = attention_layout(attrs);
  return layout.ok() ? *layout : AttentionLayout::kBHTD;
}

AttentionOperand attention_operand_of(AttentionLayout layout, const Shape& shape) {
  const Expected<AttentionOperand> operand = attention_operand(layout, shape);
  return operand.ok() ? *operand : AttentionOperand{};
}

std::array<int64_t, 4> attention_steps(AttentionLayout layout, int64_t b, int64_t h, int64_t t, int64_t e) {
  if (layout == AttentionLayout::kBTHD) return {t * h * e, e, h * e, 1};
  if (layout == AttentionLayout::kTBHD) return {h * e, e, b * h * e, 1};
  return {h * t * e, t * e, e, 1};
}

Shape attention_operand_shape(AttentionLayout layout, const Shape& batch, int64_t t, int64_t e) {
  if (layout == AttentionLayout::kBTHD) return {batch[0], t, batch[1], e};
  if (layout == AttentionLayout::kTBHD) return {t, batch[0], batch[1], e};
  Shape s = batch;
  s.push_back(t);
  s.push_back(e);
  return s;
}

}  // namespace memc
