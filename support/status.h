// Errors as values at the library boundary (file input, CLI, plan loading).
// Internal invariants use MEMC_CHECK, which aborts with context.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace memc {

// Exit codes of the CLI contract (../shared/CLI.md).
enum class ErrorKind { kInternal = 1, kBadInput = 2, kBudget = 3 };

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status BadInput(std::string msg) { return Status(ErrorKind::kBadInput, std::move(msg)); }
  static Status Budget(std::string msg) { return Status(ErrorKind::kBudget, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(ErrorKind::kInternal, std::move(msg)); }

  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  ErrorKind kind() const { return error_ ? error_->first : ErrorKind::kInternal; }
  const std::string& message() const {
    static const std::string kEmpty;
    return error_ ? error_->second : kEmpty;
  }
  int exit_code() const { return ok() ? 0 : static_cast<int>(error_->first); }
  // Prefixes context ("file.onnx: ") to the message, keeping the kind.
  Status with_context(const std::string& prefix) const {
    if (ok()) return *this;
    Status s(error_->first, prefix + error_->second);
    s.every_rank_ = every_rank_;
    return s;
  }
  // The verdict of a collective check, which every rank of a job reaches alike: rank 0 reports
  // it, and the others end with its exit code without a line of their own.
  Status on_every_rank() const {
    Status s = *this;
    s.every_rank_ = !ok();
    return s;
  }
  bool reached_by_every_rank() const { return every_rank_; }

 private:
  Status(ErrorKind kind, std::string msg) : error_(std::make_pair(kind, std::move(msg))) {}
  std::optional<std::pair<ErrorKind, std::string>> error_;
  bool every_rank_ = false;
};

// A value or the Status explaining why there is none.
template <typename T>
class Expected {
 public:
  Expected(T value) : data_(std::move(value)) {}  // NOLINT: implicit by design
  Expected(Status status) : data_(std::move(status)) {  // NOLINT
    if (std::get<Status>(data_).ok()) data_ = Status::Internal("Expected built from an OK status");
  }
  bool ok() const { return std::holds_alternative<T>(data_); }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(data_);
  }
  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> data_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace memc

#define MEMC_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) ::memc::check_failed(__FILE__, __LINE__, #cond, ::memc::detail_cat(__VA_ARGS__)); \
  } while (0)

#define MEMC_RETURN_IF_ERROR(expr)          \
  do {                                      \
    ::memc::Status _memc_status = (expr);   \
    if (!_memc_status.ok()) return _memc_status; \
  } while (0)

#define MEMC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
#define MEMC_CONCAT_INNER(a, b) a##b
#define MEMC_CONCAT(a, b) MEMC_CONCAT_INNER(a, b)
#define MEMC_ASSIGN_OR_RETURN(lhs, expr) \
  MEMC_ASSIGN_OR_RETURN_IMPL(MEMC_CONCAT(_memc_expected_, __LINE__), lhs, expr)

#include <sstream>
namespace memc {
template <typename... Args>
std::string detail_cat(Args&&... args) {
  std::ostringstream os;
  ((os << args), ...);
  return os.str();
}
// Builds a message from pieces: str_cat("node ", name, ": bad axis ", axis).
template <typename... Args>
std::string str_cat(Args&&... args) {
  return detail_cat(std::forward<Args>(args)...);
}
}  // namespace memc
