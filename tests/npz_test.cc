// runtime/npz: round trips per dtype, NumPy-written archives (tests/data/make_npz_fixtures.py),
// and corrupt input that must give a BadInput naming the file and array, never a crash.
#include "runtime/npz.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "tests/test_util.h"

namespace memc {
namespace {

namespace fs = std::filesystem;
using testing::source_path;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("memc_npz_test_" + std::to_string(getpid()) + "_" + name)).string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

TEST(Npz, RoundTripEveryDtype) {
  std::mt19937 rng(7);
  TensorMap arrays;
  for (DType dt : {DType::kF32, DType::kF64, DType::kF16, DType::kI64, DType::kI32, DType::kBool, DType::kU8})
    arrays[std::string(dtype_name(dt))] = testing::random_tensor(dt, {3, 5}, rng, 0, 100);
  arrays["scalar"] = testing::random_tensor(DType::kF32, {}, rng);
  arrays["empty"] = Tensor::zeros(DType::kF32, {0, 7});
  arrays["empty_i64"] = Tensor::zeros(DType::kI64, {0});
  arrays["grad/block.0.weight"] = testing::random_tensor(DType::kF32, {2, 2, 2}, rng);
  const std::string path = temp_path("round.npz");
  ASSERT_TRUE(write_npz(path, arrays).ok());
  auto back = read_npz(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), arrays.size());
  for (const auto& [key, t] : arrays) {
    ASSERT_TRUE(back->count(key)) << key;
    EXPECT_TRUE(same_bytes(back->at(key), t)) << key;
  }
  // The in-memory reader agrees with the file reader.
  auto from_bytes = read_npz_bytes(slurp(path), "mem");
  ASSERT_TRUE(from_bytes.ok()) << from_bytes.status().message();
  EXPECT_EQ(from_bytes->size(), arrays.size());
  fs::remove(path);
}

TEST(Npz, EmptyArchiveRoundTrips) {
  const std::string path = temp_path("none.npz");
  ASSERT_TRUE(write_npz(path, {}).ok());
  auto back = read_npz(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->empty());
  fs::remove(path);
}

TEST(Npz, NpyHeaderIsWhatNumpyWrites) {
  Tensor t = Tensor::zeros(DType::kF32, {5});
  auto bytes = serialize_npy(t, "t");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 128u + 20u);  // header padded to a multiple of 64, then 5 floats
  EXPECT_NE(bytes->find("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }"), std::string::npos);
  Tensor s = Tensor::zeros(DType::kI64, {});
  EXPECT_NE(serialize_npy(s, "s")->find("'shape': ()"), std::string::npos);
}

TEST(Npz, ReadsNumpyStoredAndDeflated) {
  for (const char* name : {"tests/data/numpy_stored.npz", "tests/data/numpy_deflated.npz"}) {
    auto arrays = read_npz(source_path(name));
    ASSERT_TRUE(arrays.ok()) << arrays.status().message();
    const TensorMap& a = *arrays;
    ASSERT_EQ(a.size(), 10u) << name;
    EXPECT_EQ(a.at("f32").dtype(), DType::kF32);
    EXPECT_EQ(a.at("f32").shape(), (Shape{2, 3}));
    EXPECT_EQ(a.at("f32").get_as_double(5), 1.25);
    EXPECT_EQ(a.at("f64").get_as_double(1), -2.25);
    EXPECT_EQ(a.at("f16").dtype(), DType::kF16);
    EXPECT_EQ(a.at("f16").get_as_double(2), 65504.0);
    EXPECT_EQ(a.at("i64").get_as_int(3), int64_t{1} << 40);
    EXPECT_EQ(a.at("i32").get_as_int(1), -8);
    EXPECT_EQ(a.at("b1").dtype(), DType::kBool);
    EXPECT_EQ(a.at("b1").get_as_int(1), 0);
    EXPECT_EQ(a.at("b1").get_as_int(2), 1);
    EXPECT_EQ(a.at("u1").get_as_int(1), 255);
    EXPECT_EQ(a.at("scalar").shape(), Shape{});
    EXPECT_EQ(a.at("scalar").get_as_double(0), 3.5);
    EXPECT_EQ(a.at("empty").shape(), (Shape{0, 4}));
    EXPECT_EQ(a.at("grad/w").numel(), 4);
  }
}

TEST(Npz, FortranOrderIsReadRowMajor) {
  // a = np.asfortranarray(np.arange(6).reshape(2, 3)): the values read back in row-major order.
  auto arrays = read_npz(source_path("tests/data/numpy_fortran.npz"));
  ASSERT_TRUE(arrays.ok()) << arrays.status().message();
  const Tensor& a = arrays->at("a");
  ASSERT_EQ(a.shape(), (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a.get_as_double(i), i);
  const Tensor& b = arrays->at("b");  // np.arange(24).reshape(2, 3, 4), Fortran order
  ASSERT_EQ(b.shape(), (Shape{2, 3, 4}));
  for (int i = 0; i < 24; ++i) EXPECT_EQ(b.get_as_int(i), i);
}

void expect_bad(const Expected<TensorMap>& r, const std::string& needle) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().kind(), ErrorKind::kBadInput);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << "one line: " << r.status().message();
}

TEST(Npz, RefusesWhatItCannotRepresent) {
  expect_bad(read_npz(source_path("tests/data/numpy_bigendian.npz")), "big-endian");
  expect_bad(read_npz(source_path("tests/data/numpy_object.npz")), "object arrays");
  TensorMap bf16{{"w", Tensor::zeros(DType::kBF16, {2})}};
  Status s = write_npz(temp_path("bf16.npz"), bf16);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("array 'w'"), std::string::npos) << s.message();
}

TEST(Npz, MissingAndGarbageFiles) {
  expect_bad(read_npz("/nonexistent/in.npz"), "/nonexistent/in.npz: no such file");
  const std::string garbage = temp_path("garbage.npz");
  spit(garbage, "this is not a zip archive at all, just text\n");
  expect_bad(read_npz(garbage), garbage + ": not a readable .npz archive");
  spit(garbage, "");
  expect_bad(read_npz(garbage), garbage);
  fs::remove(garbage);
}

TEST(Npz, TruncatedArchivesNeverCrash) {
  const std::string good = slurp(source_path("tests/data/numpy_stored.npz"));
  const std::string deflated = slurp(source_path("tests/data/numpy_deflated.npz"));
  for (const std::string* src : {&good, &deflated}) {
    for (size_t n = 0; n < src->size(); n += 7) {
      auto r = read_npz_bytes(std::string_view(*src).substr(0, n), "cut.npz");
      EXPECT_FALSE(r.ok()) << n;
      if (!r.ok()) {
        EXPECT_EQ(r.status().message().rfind("cut.npz", 0), 0u) << r.status().message();
      }
    }
  }
}

TEST(Npz, FlippedBytesNeverCrash) {
  const std::string good = slurp(source_path("tests/data/numpy_deflated.npz"));
  std::mt19937 rng(1);
  int failures = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes = good;
    for (int k = 0; k < 3; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    auto r = read_npz_bytes(bytes, "flip.npz");
    failures += !r.ok();
  }
  EXPECT_GT(failures, 0);
}

TEST(Npz, CorruptNpyHeaders) {
  Tensor t = Tensor::zeros(DType::kF32, {2, 3});
  const std::string npy = *serialize_npy(t, "t");
  ASSERT_TRUE(parse_npy(npy, "t").ok());
  const auto bad = [](std::string bytes, const std::string& needle) {
    auto r = parse_npy(bytes, "in.npz: array 'x'");
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().rfind("in.npz: array 'x'", 0), 0u);
  };
  bad(npy.substr(0, 5), "truncated .npy header");
  bad(npy.substr(0, 40), "truncated .npy header");
  bad(npy.substr(0, npy.size() - 1), "truncated or corrupt");
  bad("XXNUMPY" + npy.substr(7), "bad magic");
  std::string v9 = npy;
  v9[6] = 9;
  bad(v9, "version 9");
  const auto with_dict = [&](const std::string& dict) {
    std::string out = npy.substr(0, 8);
    out += static_cast<char>(dict.size() & 0xff);
    out += static_cast<char>(dict.size() >> 8);
    return out + dict + std::string(24, '\0');
  };
  bad(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3"), "malformed");
  bad(with_dict("{'descr': '<f4', 'fortran_order': False}"), "missing");
  bad(with_dict("{'descr': '<c8', 'fortran_order': False, 'shape': (3,)}"), "dtype '<c8' is not supported");
  bad(with_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,)}"), "structured");
  bad(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999)}"), "too large");
  bad(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}"), "malformed");
  // Version 2 (4-byte header length) and version 3 headers read like version 1.
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }";
  for (char version : {2, 3}) {
    std::string v = std::string("\x93NUMPY") + version + '\0';
    v += static_cast<char>(dict.size());
    v += std::string(3, '\0');
    v += dict + std::string(24, '\0');
    auto r = parse_npy(v, "v");
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->shape(), Shape{6});
  }
}

TEST(Npz, WriteIsAtomic) {
  const std::string path = temp_path("keep.npz");
  TensorMap one{{"x", Tensor::zeros(DType::kF32, {3})}};
  ASSERT_TRUE(write_npz(path, one).ok());
  const std::string before = slurp(path);
  // A failing write (bf16 has no NumPy dtype) leaves the old file as it was, and no temp file.
  TensorMap bad{{"y", Tensor::zeros(DType::kBF16, {3})}};
  EXPECT_FALSE(write_npz(path, bad).ok());
  EXPECT_EQ(slurp(path), before);
  for (const auto& entry : fs::directory_iterator(fs::path(path).parent_path()))
    EXPECT_EQ(entry.path().string().find(path + ".tmp"), std::string::npos) << entry.path();
  fs::remove(path);
}

TEST(Npz, WriteIntoMissingFolderIsBadInput) {
  Status s = write_npz("/nonexistent_dir_memc/out.npz", {{"x", Tensor::zeros(DType::kF32, {1})}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.kind(), ErrorKind::kBadInput);
  EXPECT_NE(s.message().find("does not exist"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace memc
