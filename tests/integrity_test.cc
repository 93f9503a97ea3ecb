// Integrity of what memc writes and reads back (issue 14): CRC-32C, safetensors checksums and
// layout checks, the output guard, the checkpoint-folder lock, stale temporaries.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/file_guard.h"
#include "runtime/safetensors.h"
#include "support/crc32c.h"
#include "tests/test_util.h"

namespace memc {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const fs::path dir = testing::scratch_path("integrity_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

TEST(Crc32c, KnownValuesAndChaining) {
  // The CRC-32C check value (RFC 3720 / iSCSI): "123456789" -> 0xE3069283.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::string big(100003, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  const uint32_t whole = crc32c(big.data(), big.size());
  EXPECT_EQ(crc32c(big.data() + 777, big.size() - 777, crc32c(big.data(), 777)), whole);
  EXPECT_EQ(crc32c_hex(0xE3069283u), "e3069283");
}

SafetensorsFile small_file() {
  SafetensorsFile f;
  for (int k = 0; k < 3; ++k) {
    Tensor t = Tensor::zeros(DType::kF32, {static_cast<int64_t>(5 + k)});
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(k * 10 + i) * 0.25f;
    f.tensors["w" + std::to_string(k)] = t;
  }
  f.metadata["step"] = "4";
  return f;
}

TEST(Safetensors, ChecksumsRoundTripAndStayOutOfMetadata) {
  const std::string path = temp_dir("rt") + "/a.safetensors";
  ASSERT_TRUE(write_safetensors(path, small_file()).ok());
  auto back = read_safetensors(path, /*require_checksums=*/true);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->metadata.size(), 1u);
  EXPECT_EQ(back->metadata.at("step"), "4");
  EXPECT_EQ(back->tensors.size(), 3u);
}

// Every byte of the data section, flipped, is caught and named by its tensor.
TEST(Safetensors, EveryFlippedDataByteIsDetected) {
  const std::string dir = temp_dir("flip");
  const std::string path = dir + "/a.safetensors";
  ASSERT_TRUE(write_safetensors(path, small_file()).ok());
  const std::string good = read_bytes(path);
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i) header |= static_cast<uint64_t>(static_cast<unsigned char>(good[i])) << (8 * i);
  const size_t data_start = 8 + header;
  ASSERT_EQ(good.size() - data_start, (5 + 6 + 7) * 4u);
  for (size_t at = data_start; at < good.size(); ++at) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    write_bytes(path, bad);
    auto r = read_safetensors(path);
    ASSERT_FALSE(r.ok()) << "flip at " << at;
    EXPECT_NE(r.status().message().find("checksum mismatch"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("tensor 'w"), std::string::npos) << r.status().message();
  }
}

TEST(Safetensors, TrailingBytesOverlapsAndHolesAreRefused) {
  const std::string dir = temp_dir("layout");
  const std::string path = dir + "/a.safetensors";
  ASSERT_TRUE(write_safetensors(path, small_file()).ok());
  const std::string good = read_bytes(path);
  write_bytes(path, good + "junk");
  auto trailing = read_safetensors(path);
  ASSERT_FALSE(trailing.ok());
  EXPECT_NE(trailing.status().message().find("trailing bytes"), std::string::npos) << trailing.status().message();

  // A hand-written header: w1 overlaps w0; then a hole between two tensors.
  auto file_with = [&](const std::string& json, size_t data_bytes) {
    std::string text = json;
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
    return out + text + std::string(data_bytes, '\0');
  };
  write_bytes(path, file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12));
  auto overlap = read_safetensors(path);
  ASSERT_FALSE(overlap.ok());
  EXPECT_NE(overlap.status().message().find("overlap"), std::string::npos) << overlap.status().message();
  write_bytes(path, file_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12));
  auto hole = read_safetensors(path);
  ASSERT_FALSE(hole.ok());
  EXPECT_NE(hole.status().message().find("belong to no tensor"), std::string::npos) << hole.status().message();
  // Without checksums: accepted unless required.
  write_bytes(path, file_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4));
  EXPECT_TRUE(read_safetensors(path).ok());
  auto required = read_safetensors(path, /*require_checksums=*/true);
  ASSERT_FALSE(required.ok());
  EXPECT_NE(required.status().message().find("checksum"), std::string::npos);
}

TEST(Safetensors, AnEditedHeaderIsDetected) {
  const std::string path = temp_dir("header") + "/a.safetensors";
  ASSERT_TRUE(write_safetensors(path, small_file()).ok());
  std::string bytes = read_bytes(path);
  const size_t at = bytes.find("\"step\":\"4\"");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 8] = '7';  // step 4 -> 7, still valid JSON
  write_bytes(path, bytes);
  auto r = read_safetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("header checksum mismatch"), std::string::npos) << r.status().message();
}

TEST(FileGuard, OutputsNeverDestroyInputs) {
  const std::string dir = temp_dir("guard");
  const std::string in = dir + "/in.bin", link = dir + "/hard.bin", out = dir + "/out.bin";
  write_bytes(in, "input");
  fs::create_hard_link(in, link);
  auto same = check_outputs({in}, {{"-o", link}}, /*force=*/true);
  ASSERT_FALSE(same.ok());
  EXPECT_EQ(same.exit_code(), 2);
  EXPECT_NE(same.message().find("same file as the input"), std::string::npos) << same.message();
  EXPECT_TRUE(check_outputs({in}, {{"-o", out}}, false).ok());
  write_bytes(out, "old");
  auto exists = check_outputs({in}, {{"-o", out}}, false);
  ASSERT_FALSE(exists.ok());
  EXPECT_NE(exists.message().find("--force"), std::string::npos);
  EXPECT_TRUE(check_outputs({in}, {{"-o", out}}, true).ok());
  auto twice = check_outputs({}, {{"--json", dir + "/r.json"}, {"--dump-grads", dir + "/./r.json"}}, true);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.message().find("also the output of --json"), std::string::npos) << twice.message();
  EXPECT_EQ(read_bytes(in), "input");
}

TEST(FileGuard, StaleTemporariesOfDeadWritersGo) {
  const std::string dir = temp_dir("stale");
  const std::string target = dir + "/checkpoint.safetensors";
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);  // a pid that is surely gone now
  const std::string dead = target + ".tmp." + std::to_string(child), live = target + ".tmp." + std::to_string(getppid());
  write_bytes(dead, "partial");
  write_bytes(live, "someone else's, still writing");
  write_bytes(dir + "/other.tmp.1", "not ours");
  EXPECT_EQ(remove_stale_temps(target), 1);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(dir + "/other.tmp.1"));
}

TEST(FileGuard, OneHolderPerCheckpointFolder) {
  const std::string dir = temp_dir("lock") + "/ck";
  auto first = FolderLock::acquire(dir);
  ASSERT_TRUE(first.ok()) << first.status().message();
  auto second = FolderLock::acquire(dir);  // flock conflicts across open files, even in one process
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().exit_code(), 2);
  EXPECT_NE(second.status().message().find("in use by memc pid " + std::to_string(getpid())), std::string::npos) << second.status().message();
  { FolderLock released = std::move(first).value(); }
  EXPECT_TRUE(FolderLock::acquire(dir).ok());
}

}  // namespace
}  // namespace memc
