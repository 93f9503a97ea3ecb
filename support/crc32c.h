// CRC-32C (Castagnoli, the iSCSI/ext4 polynomial 0x82F63B78): the checksum of checkpoint
// tensors and of the model files a plan reads. Hand-written: SSE4.2's crc32 instruction when
// the CPU has it, else slicing-by-8 tables; both give the same value.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace memc {

// Continues a running checksum: crc32c(b, crc32c(a)) == crc32c(a ‖ b). Start from 0.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// Eight lower-case hex digits, as stored in files.
std::string crc32c_hex(uint32_t crc);

}  // namespace memc
