// The CPU backend behind the Backend seam (backends/backend.h): the reference kernels of
// backends/cpu, memory from the C heap, and one in-order synchronous "stream", so an async copy
// has completed when it returns and events are always reached.
#pragma once
#include "backends/backend.h"

namespace memc::cpu {

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  const Kernel* find_kernel(std::string_view op) const override;
  int64_t workspace_bytes(const Module& module, const Node& node) const override;
  Expected<void*> allocate(MemoryKind kind, int64_t bytes) override;
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
};

}  // namespace memc::cpu
