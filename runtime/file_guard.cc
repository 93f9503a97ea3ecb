#include "runtime/file_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace memc {

namespace fs = std::filesystem;

namespace {

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// The path an output will have once written, to compare outputs that do not exist yet.
std::string normal_path(const std::string& p) {
  std::error_code ec;
  fs::path n = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::path(p).lexically_normal().string() : n.string();
}

bool pid_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

}  // namespace

int remove_stale_temps(const std::string& target) {
  const fs::path path(target);
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const std::string prefix = path.filename().string() + ".tmp.";
  std::error_code ec;
  int removed = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid_text = name.substr(prefix.size());
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9) continue;
    const long pid = std::stol(pid_text);
    if (pid == static_cast<long>(::getpid()) || pid_alive(pid)) continue;
    std::error_code rm;
    if (fs::remove(it->path(), rm)) ++removed;
  }
  return removed;
}

Status check_outputs(const std::vector<std::string>& inputs, const std::vector<OutputFile>& outputs, bool force) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const OutputFile& out = outputs[i];
    if (out.path.empty()) continue;
    const std::string where = out.flag + " " + out.path;
    for (size_t j = 0; j < i; ++j) {
      if (!outputs[j].path.empty() && normal_path(outputs[j].path) == normal_path(out.path)) {
        return Status::BadInput(where + ": is also the output of " + outputs[j].flag);
      }
    }
    if (out.governed) continue;
    for (const std::string& in : inputs) {
      if (!in.empty() && same_file(out.path, in)) {
        return Status::BadInput(where + ": is the same file as the input " + in + "; refusing to overwrite an input");
      }
    }
    std::error_code ec;
    const fs::path target(out.path);
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    if (fs::is_directory(target, ec)) return Status::BadInput(where + ": cannot write: is a directory");
    if (!fs::is_directory(dir, ec)) return Status::BadInput(where + ": cannot write: folder '" + dir.string() + "' does not exist");
    if (!force && fs::exists(fs::symlink_status(target, ec))) {
      return Status::BadInput(where + ": exists; pass --force to replace it");
    }
  }
  for (const OutputFile& out : outputs) {
    if (!out.path.empty() && !out.governed) remove_stale_temps(out.path);
  }
  return Status::Ok();
}

Expected<FolderLock> FolderLock::acquire(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) return Status::BadInput(dir + ": cannot create checkpoint folder" + (ec ? ": " + ec.message() : ""));
  const std::string path = (fs::path(dir) / ".memc.lock").string();
  FolderLock lock;
  lock.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock.fd_ < 0) return Status::BadInput(path + ": cannot open the folder's lock (" + std::strerror(errno) + ")");
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return Status::BadInput(path + ": cannot lock (" + std::strerror(errno) + ")");
    char buf[32] = {};
    const ssize_t n = ::pread(lock.fd_, buf, sizeof buf - 1, 0);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return Status::BadInput(dir + ": checkpoint folder is in use by memc pid " + holder + " (one run at a time)");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock.fd_, 0) != 0 || ::pwrite(lock.fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return Status::BadInput(path + ": cannot write the lock (" + std::strerror(errno) + ")");
  }
  return lock;
}

FolderLock& FolderLock::operator=(FolderLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace memc
