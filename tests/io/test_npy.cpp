// .npy reader/writer: round trips, hand-written files of every supported version and dtype,
// and one test per malformed-file error.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "locks/error.h"
#include "locks/npy.h"

namespace fs = std::filesystem;
using locks::NpyArray;

namespace {

// A per-test path: ctest runs each test in its own process, possibly in parallel.
std::string tmp_path(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::temp_directory_path() / "locks_io_tests";
  fs::create_directories(dir);
  return (dir / (std::string(info->name()) + "_" + tag + "_" + std::to_string(getpid()) + ".npy"))
      .string();
}

// Raw .npy bytes: magic, version, header length (u16 for 1.x, u32 otherwise), header, payload.
std::string npy_bytes(int major, const std::string& header, const std::string& payload) {
  std::string b = "\x93NUMPY";
  b.push_back(static_cast<char>(major));
  b.push_back(0);
  const uint32_t n = static_cast<uint32_t>(header.size());
  if (major == 1) {
    const uint16_t n16 = static_cast<uint16_t>(n);
    b.append(reinterpret_cast<const char*>(&n16), 2);
  } else {
    b.append(reinterpret_cast<const char*>(&n), 4);
  }
  return b + header + payload;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string f32_payload(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// Expects npy_load(path) to throw locks::Error whose message contains every fragment.
void expect_load_error(const std::string& path, const std::vector<std::string>& fragments) {
  try {
    locks::npy_load(path);
    FAIL() << "npy_load accepted " << path;
  } catch (const locks::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
  }
}

}  // namespace

TEST(Npy, RoundTripShapes) {
  const std::vector<std::vector<int64_t>> shapes = {{7}, {3, 5}, {2, 3, 4}, {0, 128}, {}};
  for (const auto& shape : shapes) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = 0.25f * static_cast<float>(i) - 3.0f;
    const std::string path = tmp_path("rt" + std::to_string(shape.size()));
    locks::npy_save(path, v.data(), shape);
    // numpy aligns the data offset to 64 bytes; so do we.
    const auto size = fs::file_size(path);
    EXPECT_EQ((size - 4 * n) % 64, 0u);
    const NpyArray a = locks::npy_load(path);
    EXPECT_EQ(a.shape, shape);
    EXPECT_EQ(a.size(), n);
    EXPECT_EQ(a.source_dtype, "float32");
    EXPECT_EQ(a.data, v);
  }
}

TEST(Npy, RoundTripKeepsSpecialValuesBitExact) {
  const std::vector<float> v = {0.0f, -0.0f, 1e-40f, 3.4e38f, -1.5f, 1.0f / 3.0f};
  const std::string path = tmp_path("special");
  locks::npy_save(path, v.data(), {2, 3});
  const NpyArray a = locks::npy_load(path);
  ASSERT_EQ(a.data.size(), v.size());
  EXPECT_EQ(std::memcmp(a.data.data(), v.data(), v.size() * 4), 0);
}

TEST(Npy, ReadsFloat16AndConverts) {
  // 1, -2, 0.5, 65504 (largest half), 2^-24 (smallest subnormal), +inf
  const uint16_t h[6] = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x7C00};
  const std::string payload(reinterpret_cast<const char*>(h), sizeof h);
  for (const char* descr : {"<f2", "|f2"}) {
    const std::string path = tmp_path(descr[0] == '<' ? "le" : "na");
    write_file(path, npy_bytes(1,
                               std::string("{'descr': '") + descr +
                                   "', 'fortran_order': False, 'shape': (2, 3), }\n",
                               payload));
    const NpyArray a = locks::npy_load(path);
    EXPECT_EQ(a.source_dtype, "float16");
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
    ASSERT_EQ(a.data.size(), 6u);
    EXPECT_EQ(a.data[0], 1.0f);
    EXPECT_EQ(a.data[1], -2.0f);
    EXPECT_EQ(a.data[2], 0.5f);
    EXPECT_EQ(a.data[3], 65504.0f);
    EXPECT_EQ(a.data[4], std::ldexp(1.0f, -24));
    EXPECT_TRUE(std::isinf(a.data[5]) && a.data[5] > 0);
  }
}

TEST(Npy, ReadsVersions2And3AndAnyKeyOrder) {
  const std::vector<float> v = {1, 2, 3, 4};
  for (int major : {2, 3}) {
    const std::string path = tmp_path("v" + std::to_string(major));
    // Keys reordered, double quotes, no trailing comma, Python-2 long suffix: all legal.
    write_file(
        path,
        npy_bytes(major, "{\"shape\": (4L,), \"fortran_order\": False, \"descr\": \"<f4\"}  \n",
                  f32_payload(v)));
    const NpyArray a = locks::npy_load(path);
    EXPECT_EQ(a.shape, (std::vector<int64_t>{4}));
    EXPECT_EQ(a.data, v);
  }
}

TEST(Npy, WritesInt32) {
  const std::vector<int32_t> v = {-1, 0, 7, 1 << 30};
  const std::string path = tmp_path("i32");
  locks::npy_save_i32(path, v.data(), {4});
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(bytes.find("'descr': '<i4'"), std::string::npos);
  ASSERT_GE(bytes.size(), 16u);
  EXPECT_EQ(std::memcmp(bytes.data() + bytes.size() - 16, v.data(), 16), 0);
  // The reader is float-only and says so, naming the dtype.
  expect_load_error(path, {"unsupported dtype", "'<i4'"});
}

TEST(Npy, ErrorMissingFile) {
  const std::string path = tmp_path("missing");
  fs::remove(path);
  expect_load_error(path, {"cannot open"});
}

// Issue #12: a directory reported "file too short (9223372036854775807 bytes)".
TEST(Npy, ErrorDirectoryIsNotAFile) {
  const std::string path = tmp_path("dir");
  fs::create_directories(path);
  expect_load_error(path, {path, "not a regular file (it is a directory)"});
  try {
    locks::npy_load(path);
  } catch (const locks::Error& e) {
    EXPECT_EQ(std::string(e.what()).find("9223372036854775807"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

// Issue #12: a FIFO blocked the reader forever. In a child process, so that a regression
// fails here (killed after 10 s) instead of hanging the suite.
TEST(Npy, ErrorFifoIsRefusedWithoutBlocking) {
  const std::string path = tmp_path("fifo");
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(10);  // SIGALRM kills the child if it blocks
    try {
      locks::npy_load(path);
    } catch (const locks::Error& e) {
      ::_exit(std::string(e.what()).find("not a regular file (it is a FIFO)") != std::string::npos
                  ? 0
                  : 3);
    }
    ::_exit(4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << "the reader blocked on the FIFO (killed by the alarm)";
  if (WIFEXITED(status)) EXPECT_EQ(WEXITSTATUS(status), 0);
  fs::remove(path);
}

TEST(Npy, ErrorDeviceIsNotAFile) {
  expect_load_error("/dev/zero", {"/dev/zero", "not a regular file (it is a character device)"});
}

// Issue #12: a structured dtype was reported as a header parse error.
TEST(Npy, ErrorStructuredDtypeIsUnsupported) {
  const std::string path = tmp_path("record");
  write_file(path, npy_bytes(1,
                             "{'descr': [('x', '<f4'), ('y', '<i4')], 'fortran_order': False, "
                             "'shape': (2,), }\n",
                             std::string(16, '\0')));
  expect_load_error(path, {"unsupported dtype", "structured"});
}

TEST(Npy, ErrorFileTooShort) {
  const std::string path = tmp_path("short");
  write_file(path, "\x93NUM");
  expect_load_error(path, {"too short"});
}

TEST(Npy, ErrorBadMagic) {
  const std::string path = tmp_path("magic");
  write_file(path, "PK\x03\x04 this is a zip file, not npy");
  expect_load_error(path, {"bad magic"});
}

TEST(Npy, ErrorUnsupportedVersion) {
  const std::string path = tmp_path("v4");
  write_file(path, npy_bytes(4, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }\n",
                             f32_payload({1})));
  expect_load_error(path, {"version 4.0"});
}

TEST(Npy, ErrorTruncatedHeader) {
  const std::string path = tmp_path("trunchdr");
  std::string b = npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }\n", "");
  b.resize(b.size() - 20);
  write_file(path, b);
  expect_load_error(path, {"truncated header"});
}

TEST(Npy, ErrorBadHeaderDict) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not a dict\n", "expected '{'"},
      {"{'descr': '<f4', 'fortran_order': False}\n", "missing key 'shape'"},
      {"{'descr': '<f4', 'shape': (2,)}\n", "missing key 'fortran_order'"},
      {"{'fortran_order': False, 'shape': (2,)}\n", "missing key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}\n",
       "unexpected key 'extra'"},
      {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}\n", "True or False"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}\n", "non-negative integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [2]}\n", "expected '('"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}\n", "bad header dict"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}\n", "expected ',' or '}'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}\n",
       "duplicate key"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk\n", "trailing"},
  };
  int i = 0;
  for (const auto& [header, fragment] : cases) {
    const std::string path = tmp_path("dict" + std::to_string(i++));
    write_file(path, npy_bytes(1, header, f32_payload({1, 2})));
    expect_load_error(path, {"bad header dict", fragment});
  }
}

TEST(Npy, ErrorFortranOrder) {
  const std::string path = tmp_path("fortran");
  write_file(path, npy_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }\n",
                             f32_payload({1, 2, 3, 4})));
  expect_load_error(path, {"fortran_order", "C-order"});
}

TEST(Npy, ErrorUnsupportedDtypeIsNamed) {
  for (const std::string descr : {"<f8", ">f4", "<i8", "|u1", "<c8"}) {
    const std::string path = tmp_path("dtype" + std::to_string(descr[1]));
    write_file(path,
               npy_bytes(1, "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (2,), }\n",
                         std::string(16, '\0')));
    expect_load_error(path, {"unsupported dtype", "'" + descr + "'"});
  }
}

TEST(Npy, ErrorPayloadTruncated) {
  const std::string path = tmp_path("trunc");
  write_file(path, npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n",
                             f32_payload({1, 2, 3, 4, 5})));
  expect_load_error(path, {"payload size mismatch", "needs 24 bytes", "holds 20", "truncated"});
}

TEST(Npy, ErrorPayloadTooLong) {
  const std::string path = tmp_path("long");
  write_file(path, npy_bytes(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }\n",
                             std::string(8, '\0')));
  expect_load_error(path, {"payload size mismatch", "needs 6 bytes", "holds 8", "too long"});
}

TEST(Npy, ErrorSaveToUnwritablePath) {
  const float x = 1.0f;
  EXPECT_THROW(locks::npy_save("/nonexistent_dir_locks/x.npy", &x, {1}), locks::Error);
  EXPECT_THROW(locks::npy_save(tmp_path("neg"), &x, {-1}), locks::Error);
  EXPECT_THROW(locks::npy_save(tmp_path("huge"), &x, {int64_t(1) << 62, 8}), locks::Error);
}

// Issue #12: a full disk gave 0-byte files and no error. /dev/full fails every write with
// ENOSPC; the error names the file and the cause.
TEST(Npy, ErrorSaveToFullDisk) {
  const std::vector<float> x(1000, 1.0f);
  try {
    locks::npy_save("/dev/full", x.data(), {1000});
    FAIL() << "no error writing to /dev/full";
  } catch (const locks::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
  }
}
