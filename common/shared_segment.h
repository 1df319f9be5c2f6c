// Shared memory between a worker and a parameter server on the same host, so
// that a pull's values skip the gRPC stream (its framing, flow control and
// two kernel copies over loopback): the server copies them into the worker's
// segment, and the gRPC call carries only which variables are there. gRPC
// stays the control path, and the path for every other case.
//
// The worker owns the memory (SharedSegment): a memfd named
// "towerps-segment", sealed against growing and shrinking, mapped by the
// worker, whose first bytes hold a magic string and a random 16-byte nonce.
// It tells the server (PullRequest.segment) its pid, the descriptor's number
// and the nonce. The server (SegmentFile) opens /proc/<pid>/fd/<fd> only
// when that names a towerps segment, then checks the seals, the file system,
// the size and the nonce, so that:
//   - on another host, in another pid namespace (a container) or as another
//     user the open fails or the nonce differs, and the pull goes over gRPC;
//   - a request cannot make a server write into any other file: only into
//     a sealed memfd of that name whose 128-bit nonce the caller knew;
//   - nothing the worker does to the memory can fault the server, which maps
//     it: the seals keep the file from shrinking under the mapping (no
//     access past its end), and only a memfd on tmpfs is mapped (not one on
//     hugetlbfs, whose pages can run out at a fault). A page the worker gives
//     back (MADV_REMOVE) comes back as zeros when written again. What is
//     left is the kernel failing to find a page at all, where a write or
//     read through the descriptor would have failed with ENOMEM instead.
// The server keeps a segment mapped between calls (ps_service.h): copying
// into a mapping whose pages are in place costs well under half of pwrite's CPU
// (no page cache lookup per 4 KiB, no inode lock that two servers writing
// into one worker's segment would take turns on).
#ifndef TOWERPS_COMMON_SHARED_SEGMENT_H_
#define TOWERPS_COMMON_SHARED_SEGMENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace towerps::common {

// Bytes at the start of every segment before any payload (the header: magic
// and nonce, padded to a page).
inline constexpr int64_t kSegmentHeaderBytes = 4096;
inline constexpr int kSegmentNonceBytes = 16;
// The memfd's name; /proc/<pid>/fd/<fd> reads "/memfd:towerps-segment (deleted)".
inline constexpr absl::string_view kSegmentName = "towerps-segment";

// The worker's side: owns the memfd and its mapping. Thread-compatible; the
// memory itself is shared, so who writes where when is the protocol's job.
class SharedSegment {
 public:
  // A segment with room for `payload_bytes` after the header. Unavailable
  // (naming the call that failed) where memfds or sealing are not supported.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Create(int64_t payload_bytes);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  int pid() const { return pid_; }
  int fd() const { return fd_; }
  const std::string& nonce() const { return nonce_; }
  // Whole size, header included.
  int64_t size() const { return size_; }
  // Byte `offset` of the segment (header included). REQUIRES: offset <= size().
  const char* at(int64_t offset) const { return base_ + offset; }
  char* mutable_at(int64_t offset) { return base_ + offset; }

 private:
  SharedSegment() = default;
  int pid_ = 0;
  int fd_ = -1;
  std::string nonce_;
  int64_t size_ = 0;
  char* base_ = nullptr;
};

// The server's side: one opened segment of another process, mapped (the
// descriptor is closed once mapped; the mapping keeps the memory). Move-only;
// Write and Read may be called from several threads at once (who writes
// where when is the protocol's job).
class SegmentFile {
 public:
  // Opens the segment at /proc/<pid>/fd/<fd>. FailedPrecondition naming what
  // did not hold (no such process or descriptor, not a towerps segment, not
  // sealed, another size, another nonce); InvalidArgument for values that
  // cannot be right (pid or fd out of range, a nonce of the wrong length, a
  // size below the header's).
  static absl::StatusOr<SegmentFile> Open(int64_t pid, int64_t fd, absl::string_view nonce,
                                          int64_t size);
  SegmentFile(SegmentFile&& other) noexcept;
  SegmentFile& operator=(SegmentFile&& other) noexcept;
  ~SegmentFile();

  int64_t size() const { return size_; }
  // Whether [offset, offset + bytes) lies in the payload (past the header).
  bool Fits(int64_t offset, int64_t bytes) const;
  // Copies `bytes` bytes to / from byte `offset`. InvalidArgument when they
  // do not fit.
  absl::Status Write(int64_t offset, const void* data, int64_t bytes);
  absl::Status Read(int64_t offset, void* data, int64_t bytes);
  // The mapping's bytes [offset, offset + bytes), for memory both sides use
  // at once (common/shm_channel.h). InvalidArgument when they do not fit.
  absl::StatusOr<char*> Region(int64_t offset, int64_t bytes);

 private:
  SegmentFile(char* base, int64_t size) : base_(base), size_(size) {}
  // Fits, or InvalidArgument naming the range and the size.
  absl::Status CheckFits(int64_t offset, int64_t bytes) const;
  char* base_ = nullptr;  // the mapping (owned), or null once moved from
  int64_t size_ = 0;
};

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_SHARED_SEGMENT_H_
