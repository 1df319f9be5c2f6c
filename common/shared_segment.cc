#include "common/shared_segment.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace towerps::common {
namespace {

// The header: 16 bytes of magic, then the nonce.
constexpr char kMagic[] = "towerps-segment1";
constexpr int kMagicBytes = 16;
static_assert(sizeof(kMagic) == kMagicBytes + 1);
// Largest segment either side accepts (1 TiB).
constexpr int64_t kMaxSegmentBytes = int64_t{1} << 40;

// `what`: strerror(e). Callers read errno before building `what`.
std::string Errno(absl::string_view what, int e) {
  return absl::StrCat(what, ": ", std::strerror(e));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Create(int64_t payload_bytes) {
  if (payload_bytes < 0 || payload_bytes > kMaxSegmentBytes - kSegmentHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared segment: ", payload_bytes, " bytes is out of range"));
  }
  std::unique_ptr<SharedSegment> s(new SharedSegment());
  s->pid_ = static_cast<int>(getpid());
  s->size_ = kSegmentHeaderBytes + payload_bytes;
  s->nonce_.resize(kSegmentNonceBytes);
  if (getrandom(s->nonce_.data(), s->nonce_.size(), 0) !=
      static_cast<ssize_t>(s->nonce_.size())) {
    return absl::UnavailableError(Errno("shared segment: getrandom", errno));
  }
  const std::string name(kSegmentName);
  s->fd_ = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (s->fd_ < 0) return absl::UnavailableError(Errno("shared segment: memfd_create", errno));
  if (ftruncate(s->fd_, s->size_) != 0) {
    return absl::UnavailableError(Errno("shared segment: ftruncate", errno));
  }
  if (fcntl(s->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return absl::UnavailableError(Errno("shared segment: sealing", errno));
  }
  void* m = mmap(nullptr, static_cast<size_t>(s->size_), PROT_READ | PROT_WRITE, MAP_SHARED,
                 s->fd_, 0);
  if (m == MAP_FAILED) return absl::UnavailableError(Errno("shared segment: mmap", errno));
  s->base_ = static_cast<char*>(m);
  std::memcpy(s->base_, kMagic, kMagicBytes);
  std::memcpy(s->base_ + kMagicBytes, s->nonce_.data(), s->nonce_.size());
  return s;
}

SharedSegment::~SharedSegment() {
  if (base_ != nullptr) munmap(base_, static_cast<size_t>(size_));
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<SegmentFile> SegmentFile::Open(int64_t pid, int64_t fd, absl::string_view nonce,
                                              int64_t size) {
  if (pid <= 0 || pid > (int64_t{1} << 22) || fd < 0 || fd > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared segment: pid ", pid, " or fd ", fd, " is out of range"));
  }
  if (nonce.size() != kSegmentNonceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("shared segment: the nonce has ", nonce.size(),
                                                   " bytes, not ", kSegmentNonceBytes));
  }
  if (size < kSegmentHeaderBytes || size > kMaxSegmentBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared segment: size ", size, " is out of range"));
  }
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  const std::string want = absl::StrCat("/memfd:", kSegmentName, " ");
  // Looked at before opening, so that nothing but a memfd (a device, say)
  // is ever opened; checked again on what was opened.
  auto link_of = [](const std::string& p) -> std::string {
    char buf[256];
    const ssize_t n = readlink(p.c_str(), buf, sizeof(buf) - 1);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  };
  const std::string link = link_of(path);
  if (link.empty()) {
    const int e = errno;
    return absl::FailedPreconditionError(
        Errno(absl::StrCat("shared segment: ", path, " (a worker on another host?)"), e));
  }
  if (!absl::StartsWith(link, want)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared segment: ", path, " is ", link, ", not a towerps segment"));
  }
  const int f = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (f < 0) {
    const int e = errno;
    return absl::FailedPreconditionError(Errno(absl::StrCat("shared segment: ", path), e));
  }
  absl::Cleanup close_f = [f] { close(f); };  // the mapping, once made, keeps the memory
  if (!absl::StartsWith(link_of(absl::StrCat("/proc/self/fd/", f)), want)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared segment: ", path, " changed while it was opened"));
  }
  struct stat st;
  if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared segment: ", path, " is not a segment of ", size, " bytes"));
  }
  const int seals = fcntl(f, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared segment: ", path, " is not sealed against resizing"));
  }
  // A memfd lives on tmpfs, or on hugetlbfs (MFD_HUGETLB), whose pages can
  // run out when a mapping first touches them (SIGBUS): only tmpfs is mapped.
  struct statfs fs;
  if (fstatfs(f, &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared segment: ", path, " is not a memfd on tmpfs"));
  }
  char header[kMagicBytes + kSegmentNonceBytes];
  if (pread(f, header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header)) ||
      std::memcmp(header, kMagic, kMagicBytes) != 0 ||
      std::memcmp(header + kMagicBytes, nonce.data(), kSegmentNonceBytes) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared segment: ", path, " holds another nonce"));
  }
  void* m = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  if (m == MAP_FAILED) {
    const int e = errno;
    return absl::FailedPreconditionError(Errno(absl::StrCat("shared segment: mapping ", path), e));
  }
  return SegmentFile(static_cast<char*>(m), size);
}

SegmentFile::SegmentFile(SegmentFile&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), size_(other.size_) {}

SegmentFile& SegmentFile::operator=(SegmentFile&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) munmap(base_, static_cast<size_t>(size_));
    base_ = std::exchange(other.base_, nullptr);
    size_ = other.size_;
  }
  return *this;
}

SegmentFile::~SegmentFile() {
  if (base_ != nullptr) munmap(base_, static_cast<size_t>(size_));
}

bool SegmentFile::Fits(int64_t offset, int64_t bytes) const {
  return offset >= kSegmentHeaderBytes && bytes >= 0 && offset <= size_ && bytes <= size_ - offset;
}

absl::Status SegmentFile::CheckFits(int64_t offset, int64_t bytes) const {
  if (Fits(offset, bytes)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("shared segment: ", bytes, " bytes at ", offset, " do not fit ", size_));
}

absl::Status SegmentFile::Write(int64_t offset, const void* data, int64_t bytes) {
  TOWERPS_RETURN_IF_ERROR(CheckFits(offset, bytes));
  if (bytes > 0) std::memcpy(base_ + offset, data, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status SegmentFile::Read(int64_t offset, void* data, int64_t bytes) {
  TOWERPS_RETURN_IF_ERROR(CheckFits(offset, bytes));
  if (bytes > 0) std::memcpy(data, base_ + offset, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::StatusOr<char*> SegmentFile::Region(int64_t offset, int64_t bytes) {
  TOWERPS_RETURN_IF_ERROR(CheckFits(offset, bytes));
  return base_ + offset;
}

}  // namespace towerps::common
