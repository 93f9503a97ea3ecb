#include "ir/attr.h"

#include <cstring>

namespace memc {

int64_t Attrs::get_int(const std::string& key, int64_t fallback) const {
  const Attr* a = find(key);
  if (!a) return fallback;
  if (auto* v = std::get_if<int64_t>(a)) return *v;
  // Casting a double outside int64's range (or NaN) is undefined behaviour; treat it as absent.
  if (auto* d = std::get_if<double>(a)) return (*d >= -0x1p63 && *d < 0x1p63) ? static_cast<int64_t>(*d) : fallback;
  return fallback;
}

double Attrs::get_float(const std::string& key, double fallback) const {
  const Attr* a = find(key);
  if (!a) return fallback;
  if (auto* v = std::get_if<double>(a)) return *v;
  if (auto* i = std::get_if<int64_t>(a)) return static_cast<double>(*i);
  return fallback;
}

std::string Attrs::get_string(const std::string& key, const std::string& fallback) const {
  const Attr* a = find(key);
  if (auto* v = a ? std::get_if<std::string>(a) : nullptr) return *v;
  return fallback;
}

std::vector<int64_t> Attrs::get_ints(const std::string& key, std::vector<int64_t> fallback) const {
  const Attr* a = find(key);
  if (auto* v = a ? std::get_if<std::vector<int64_t>>(a) : nullptr) return *v;
  return fallback;
}

std::vector<double> Attrs::get_floats(const std::string& key, std::vector<double> fallback) const {
  const Attr* a = find(key);
  if (auto* v = a ? std::get_if<std::vector<double>>(a) : nullptr) return *v;
  return fallback;
}

std::vector<std::string> Attrs::get_strings(const std::string& key, std::vector<std::string> fallback) const {
  const Attr* a = find(key);
  if (auto* v = a ? std::get_if<std::vector<std::string>>(a) : nullptr) return *v;
  return fallback;
}

const Tensor* Attrs::get_tensor(const std::string& key) const {
  const Attr* a = find(key);
  return a ? std::get_if<Tensor>(a) : nullptr;
}

static bool tensor_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

bool Attrs::operator==(const Attrs& other) const {
  if (map_.size() != other.map_.size()) return false;
  for (const auto& [k, v] : map_) {
    const Attr* o = other.find(k);
    if (!o || o->index() != v.index()) return false;
    const bool same = std::visit(
        [&](const auto& lhs) {
          using T = std::decay_t<decltype(lhs)>;
          const T& rhs = std::get<T>(*o);
          if constexpr (std::is_same_v<T, Tensor>) {
            return tensor_equal(lhs, rhs);
          } else {
            return lhs == rhs;
          }
        },
        v);
    if (!same) return false;
  }
  return true;
}

}  // namespace memc
