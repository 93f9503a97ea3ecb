// The CPU backend behind the Backend seam (backends/backend.h): the reference kernels of
// backends/cpu, memory from the C heap (large zeroed blocks: their own mappings), and one
// in-order synchronous "stream", so an async copy has completed when it returns and events are
// always reached.
#pragma once
#include <map>
#include <mutex>

#include "backends/backend.h"

namespace memc::cpu {

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  const Kernel* find_kernel(std::string_view op) const override;
  int64_t workspace_bytes(const Module& module, const Node& node) const override;
  Expected<void*> allocate(MemoryKind kind, int64_t bytes) override;
  Expected<void*> allocate_zeroed(MemoryKind kind, int64_t bytes) override;
  void deallocate(MemoryKind kind, void* p) override;
  Status fill(void* p, uint8_t byte, int64_t bytes) override;
  Status copy(void* dst, const void* src, int64_t bytes) override;
  Status copy_async(void* dst, const void* src, int64_t bytes, Stream stream) override;
  Stream compute_stream() override { return {}; }
  Stream copy_stream() override { return {}; }
  Expected<Event> record(Stream stream) override { return Event{}; }
  Status wait(Stream stream, Event event) override { return Status::Ok(); }
  void destroy(Event event) override {}
  Status synchronize(Stream stream) override { return Status::Ok(); }

 private:
  static constexpr int64_t kMappedBytes = int64_t{1} << 20;  // allocate_zeroed maps blocks from this size up
  std::mutex mapped_mutex_;
  std::map<void*, int64_t> mapped_;  // those blocks and their sizes, for deallocate
};

}  // namespace memc::cpu
