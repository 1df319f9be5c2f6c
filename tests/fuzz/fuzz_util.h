// What the fuzz targets share. FUZZ_CHECK for their invariants: a broken
// one prints what and where, then aborts, which libFuzzer reports as a crash
// (with the input kept) and the corpus replay as a failed test. FuzzTempDir
// and WriteFuzzFile for parsers that read files.
#ifndef TOWERPS_TESTS_FUZZ_FUZZ_UTIL_H_
#define TOWERPS_TESTS_FUZZ_FUZZ_UTIL_H_

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#define FUZZ_CHECK(cond, ...)                                                           \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant broken: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                \
      std::fprintf(stderr, "\n");                                                       \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

namespace towerps::fuzz {

// A directory of this process's own (under $TEST_TMPDIR, $TMPDIR or /tmp),
// made on first use and removed at exit.
inline const std::string& FuzzTempDir() {
  static const std::string* dir = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    if (base == nullptr) base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/towerps-fuzz-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    auto* d = new std::string(tmpl);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(FuzzTempDir(), ec);
    });
    return d;
  }();
  return *dir;
}

// Replaces `path` (creating its directory) with the bytes given.
inline void WriteFuzzFile(const std::string& path, const uint8_t* data, size_t size) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  FUZZ_CHECK(out.good(), "cannot write %s", path.c_str());
}

// The RPC fuzzers' input: records of [op byte][length, 2 bytes little-endian]
// [payload], a length past the end cut to what is left. Calls
// fn(op % num_ops, payload, length) for each record, in order.
template <typename Fn>
void ForEachRecord(const uint8_t* data, size_t size, int num_ops, Fn fn) {
  size_t pos = 0;
  while (pos + 3 <= size) {
    const int op = data[pos] % num_ops;
    const size_t len = std::min<size_t>(data[pos + 1] | (data[pos + 2] << 8), size - pos - 3);
    const uint8_t* payload = data + pos + 3;
    pos += 3 + len;
    fn(op, payload, len);
  }
}

// A handler's error, as gRPC would send it (`code` a grpc::StatusCode): one
// the API documents (not UNKNOWN, INTERNAL or DATA_LOSS, which mean a bug or
// an exception out of the handler), with a message.
inline void CheckHandlerError(int code, const std::string& message, const char* what) {
  constexpr int kUnknown = 2, kInternal = 13,
                kDataLoss = 15;  // grpc::StatusCode
  FUZZ_CHECK(code != kUnknown && code != kInternal && code != kDataLoss, "%s: code %d: %s", what,
             code, message.c_str());
  FUZZ_CHECK(code == 0 || !message.empty(), "%s: an error without a message", what);
}

}  // namespace towerps::fuzz

#endif  // TOWERPS_TESTS_FUZZ_FUZZ_UTIL_H_
