// What a command may do to the files it names (../shared/CLI.md: outputs never destroy
// inputs), checked before any work: an output that is the same file (inode) as an input is
// refused, an existing output is replaced only with --force, two outputs may not coincide.
// Also: stale temporaries of dead writers, and the lock that gives one run a checkpoint folder.
#pragma once
#include <string>
#include <vector>

#include "support/status.h"

namespace memc {

struct OutputFile {
  std::string flag;           // as the user spelled it: "-o", "--json", ...
  std::string path;           // empty: not requested
  bool governed = false;      // has its own rules (a checkpoint: --resume, its folder is created):
                              // only checked against the other outputs
};

// Refuses (exit 2) an output that resolves to any input, coincides with another output, sits
// in a missing folder or names a folder, or exists without `force`. Inputs that do not exist
// are skipped (their readers report them). Removes stale temporaries of each output.
Status check_outputs(const std::vector<std::string>& inputs, const std::vector<OutputFile>& outputs, bool force);

// Removes `<target>.tmp.<pid>` files beside `target` whose writer (pid) is gone: what a
// kill -9 during write_file_atomic leaves. Returns how many were removed.
int remove_stale_temps(const std::string& target);

// An exclusive flock on `<dir>/.memc.lock` (the folder is created), holding the owner's pid.
// A second holder gets exit 2 naming the first one's pid. Released when destroyed.
class FolderLock {
 public:
  static Expected<FolderLock> acquire(const std::string& dir);
  FolderLock() = default;
  FolderLock(FolderLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FolderLock& operator=(FolderLock&& other) noexcept;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock();

 private:
  int fd_ = -1;
};

}  // namespace memc
