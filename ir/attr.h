// Node attributes: a small closed set of kinds, printed in MLIR attribute syntax.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "ir/tensor.h"

namespace memc {

using Attr = std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<double>,
                          std::vector<std::string>, Tensor>;

// Ordered by key so printing is deterministic.
class Attrs {
 public:
  bool has(const std::string& key) const { return map_.count(key) != 0; }
  void set(const std::string& key, Attr value) { map_[key] = std::move(value); }
  void erase(const std::string& key) { map_.erase(key); }
  const Attr* find(const std::string& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> get_ints(const std::string& key, std::vector<int64_t> fallback = {}) const;
  std::vector<double> get_floats(const std::string& key, std::vector<double> fallback = {}) const;
  std::vector<std::string> get_strings(const std::string& key, std::vector<std::string> fallback = {}) const;
  const Tensor* get_tensor(const std::string& key) const;
  const std::map<std::string, Attr>& items() const { return map_; }
  bool operator==(const Attrs& other) const;

 private:
  std::map<std::string, Attr> map_;
};

}  // namespace memc
