// The op log: a memory-mapped, append-only file of checksummed msgpack records.
//
// File:   [32-byte header: "MEMR1LOG", u32 version, u32 0, u64 generation, u64 bank id][frame]...
// Frame:  [u32 length][u32 crc32c(length || payload)][payload][zero padding to 8 bytes]
// The header names the bank (the random id its manifest carries) and the generation the log belongs to,
// so a log moved from another bank or generation is refused; it is read and checked before the file is
// mapped, reserved or copied.
// The payload is written first and the 8-byte header last, as one aligned store, so a process killed
// mid-append leaves either a whole frame or a zero header, and a zero header committed nothing. A nonzero
// header whose frame fails its checksum is a committed record that was damaged: a torn write (a power
// loss lost some of its pages, which read back as zeros, or the file was cut short) is dropped and
// reported (torn_record); anything else is corruption, an error. Writes land in the page cache through the
// shared mapping, so they survive a killed process whatever the fsync policy; fsync is about power loss.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "core.h"

namespace memr1 {

// ---- the log file ----
namespace {
constexpr char kMagic[8] = {'M', 'E', 'M', 'R', '1', 'L', 'O', 'G'};
constexpr uint32_t kVersion = 2;         // 1: no bank id (refused: such a log could be another bank's)
constexpr uint64_t kHeader = 32;
constexpr uint64_t kGrow = 1 << 20;      // reservations are whole MiB...
constexpr uint64_t kMaxGrow = 64 << 20;  // ...doubling up to 64 MiB at a time
constexpr uint64_t kPage = 4096;         // the unit a power loss loses writes in
constexpr uint64_t kChunk = 1 << 20;     // what a reader copies, and the tail is probed, at a time
// Counts forks of this process. A forked child shares the parent's log file and mapping, so a handle
// opened before the latest fork must neither append (two writers) nor trim the file at close (the
// parent's later appends would be cut off and its mapping would fault past the new end).
uint64_t fork_epoch = 0;
[[maybe_unused]] const bool fork_hook = [] { return ::pthread_atfork(nullptr, nullptr, [] { ++fork_epoch; }) == 0; }();
uint64_t pad8(uint64_t n) { return (n + 7) & ~uint64_t(7); }
uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }
std::string bank_of(const std::string& log_path) {
  auto slash = log_path.rfind('/');
  return slash == std::string::npos ? std::string(".") : log_path.substr(0, slash);
}
std::string hex(uint64_t v) {
  char out[19];
  std::snprintf(out, sizeof out, "%#018llx", static_cast<unsigned long long>(v));
  return out;
}
uint64_t file_size(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) throw IoError(errno, os_error("cannot stat op log", path, errno));
  return static_cast<uint64_t>(st.st_size);
}
// The header, checked before anything is sized by the file: magic, version, then whose log it is.
void check_header(int fd, const std::string& path, uint64_t size, uint64_t generation, uint64_t bank) {
  uint8_t h[kHeader];
  if (size < kHeader || read_at(fd, h, kHeader, 0, path) < kHeader)
    throw LogFormat("op log " + path + " is shorter than its header");
  uint32_t version;
  uint64_t gen, id;
  std::memcpy(&version, h + 8, 4);
  std::memcpy(&gen, h + 16, 8);
  std::memcpy(&id, h + 24, 8);
  if (std::memcmp(h, kMagic, 8) != 0) throw LogFormat("op log " + path + " is not a memr1 op log");
  if (version != kVersion)
    throw LogFormat("op log " + path + " is of version " + std::to_string(version) + "; this code reads version " +
                    std::to_string(kVersion) + " only");
  if (id != bank)
    throw LogFormat("op log " + path + " belongs to another bank (id " + hex(id) + ", this bank's is " + hex(bank) + ")");
  if (gen != generation)
    throw LogFormat("op log " + path + " belongs to generation " + std::to_string(gen) + ", not " +
                    std::to_string(generation));
}
}  // namespace

void OpLog::create(const std::string& path, uint64_t generation, uint64_t bank) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) throw IoError(errno, os_error("cannot create op log", path, errno));
  uint8_t h[kHeader] = {};
  std::memcpy(h, kMagic, 8);
  std::memcpy(h + 8, &kVersion, 4);
  std::memcpy(h + 16, &generation, 8);
  std::memcpy(h + 24, &bank, 8);
  bool ok = ::write(fd, h, kHeader) == (ssize_t)kHeader && ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    throw IoError(err, os_error("cannot write op log", path, err));
  }
}

OpLog::OpLog(const std::string& path, bool writable, int sync, int64_t sync_every, uint64_t generation, uint64_t bank)
    : path_(path), writable_(writable), sync_(sync), sync_every_(sync_every < 1 ? 1 : sync_every),
      generation_(generation), fork_epoch_(fork_epoch) {
  fd_ = open_file(path, writable ? O_RDWR : O_RDONLY, "op log");
  try {
    if (!writable) {
      // A reader may copy the file while the writer appends: a frame whose header it copied before
      // the writer stored it, followed by one it copied after, looks like a corrupt middle. A real
      // corruption is still there on a second copy; a race is not.
      for (int attempt = 0;; ++attempt) {
        try {
          size_ = file_size(fd_, path);
          check_header(fd_, path, size_, generation, bank);
          copy_.clear();
          scan();
          break;
        } catch (const CorruptLog&) {
          if (attempt == 2) throw;
        }
      }
      copy_.resize(end_);
      copy_.shrink_to_fit();
      map_ = copy_.data();
      cap_ = end_;
      ::close(fd_);
      fd_ = -1;
      return;
    }
    size_ = file_size(fd_, path);
    check_header(fd_, path, size_, generation, bank);
    // Mapped, not reserved: reading a hole takes no block. The frames are scanned through the mapping.
    void* m = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) throw IoError(errno, os_error("cannot map op log", path, errno));
    map_ = static_cast<uint8_t*>(m);
    cap_ = size_;
    scan();
    // Cut what follows the last frame (zeros an append reserved, a dropped record, a sparse tail): the
    // log then holds only blocks its frames wrote, and appends reserve theirs (reserve()) before they
    // touch a byte, so no write through the mapping ever lands in a hole.
    if (size_ > end_) {
      if (::ftruncate(fd_, static_cast<off_t>(end_)) != 0)
        throw IoError(errno, "bank " + bank_of(path) + ": " + os_error("cannot trim op log", path, errno));
      m = ::mremap(map_, cap_, end_, 0);  // shrinks in place
      if (m == MAP_FAILED) throw IoError(errno, os_error("cannot remap op log", path, errno));
      map_ = static_cast<uint8_t*>(m);
      cap_ = end_;
    }
  } catch (...) {
    if (map_ && writable_) ::munmap(map_, cap_);
    map_ = nullptr;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw;
  }
}

OpLog::~OpLog() { try { close(); } catch (...) {} }

bool OpLog::forked() const { return fork_epoch_ != fork_epoch; }

void OpLog::check_owner() const {
  if (forked())
    throw ForkedHandle("op log " + path_ + " was opened for writing by the process this one was forked from; "
                       "a forked process may only read that bank handle: open the bank again to write");
}

// Bytes [off, off + n) of the log as the scan sees it, or null past its end: the writer's mapping, or the
// reader's copy, read further from the file only as far as the scan gets (the frames plus one chunk).
// A pointer is valid until the next call.
const uint8_t* OpLog::bytes(uint64_t off, uint64_t n) {
  if (off + n > size_) return nullptr;
  if (writable_) return map_ + off;
  if (off + n > copy_.size()) {
    const uint64_t have = copy_.size(), want = std::min(size_, std::max(off + n, have + kChunk));
    copy_.resize(want);
    copy_.resize(have + read_at(fd_, copy_.data() + have, want - have, have, path_));
    if (off + n > copy_.size()) return nullptr;  // the file is shorter by now
  }
  return copy_.data() + off;
}

// A frame at `off` is valid when its length is a record's, fits in the file and its checksum matches.
// `fetch(at, n)`: the bytes [at, at + n), or null.
template <class Fetch>
bool OpLog::frame_ok(uint64_t off, uint32_t* len_out, Fetch&& fetch) {
  const uint8_t* h = fetch(off, 8);
  if (!h) return false;
  uint32_t len, crc;
  std::memcpy(&len, h, 4);
  std::memcpy(&crc, h + 4, 4);
  if (len == 0 || len > kMaxRecord || off + 8 + pad8(len) > size_) return false;
  const uint8_t* p = fetch(off + 8, len);
  if (!p || crc32c(crc32c(0, &len, 4), p, len) != crc) return false;
  *len_out = len;
  return true;
}

// The committed frame at `off` (nonzero header) fails its checksum: torn when the file ends inside it or
// some page of its payload reads back all zeros (a write a power loss lost), else corrupt. A length no
// record has is a damaged header, not a torn write (the header is one aligned store).
bool OpLog::torn_at(uint64_t off) {
  const uint8_t* h = bytes(off, 8);
  if (!h) return true;
  uint32_t len;
  std::memcpy(&len, h, 4);
  if (len == 0 || len > kMaxRecord) return false;
  const uint64_t from = off + 8, to = from + len;
  const uint8_t* m = to <= size_ ? bytes(from, len) : nullptr;
  if (!m) return true;  // cut short
  for (uint64_t p = from; p < to; p = (p / kPage + 1) * kPage) {
    const uint64_t stop = std::min(to, (p / kPage + 1) * kPage);
    if (std::all_of(m + (p - from), m + (stop - from), [](uint8_t b) { return b == 0; })) return true;
  }
  return false;
}

// After the frames, from `off` on: sets dropped_tail_ when any byte is nonzero; true when a valid frame
// follows (a corrupt middle). Read from the file a chunk at a time, skipping holes, so that a sparse tail
// costs what it holds, not its length.
bool OpLog::valid_frame_after(uint64_t off) {
  std::vector<uint8_t> chunk(kChunk), frame;
  auto from_file = [&](uint64_t at, uint64_t n) -> const uint8_t* {
    frame.resize(n);
    return read_at(fd_, frame.data(), n, at, path_) == n ? frame.data() : nullptr;
  };
  for (uint64_t pos = off; pos < size_;) {
    const off_t data = ::lseek(fd_, static_cast<off_t>(pos), SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;                 // nothing but a hole to the end
    if (data > 0) pos = std::max(pos, static_cast<uint64_t>(data)) & ~uint64_t(7);  // else: no SEEK_DATA here
    const uint64_t n = read_at(fd_, chunk.data(), std::min(kChunk, size_ - pos), pos, path_);
    if (n == 0) break;
    for (uint64_t i = 0; i < n; i += 8) {
      uint64_t word = 0;
      std::memcpy(&word, chunk.data() + i, std::min<uint64_t>(8, n - i));
      if (word == 0 || pos + i < off) continue;
      if (!dropped_tail_) dropped_tail_ = size_ - off;
      uint32_t len;
      if (pos + i >= off + 8 && frame_ok(pos + i, &len, from_file)) return true;
    }
    pos += n;
  }
  return false;
}

// Walk the frames. The first invalid frame ends the log if nothing valid follows it and it is not a
// damaged committed record (see the file comment); if a valid frame follows, the log is corrupt in the
// middle and we refuse it.
void OpLog::scan() {
  records_.clear();
  dropped_tail_ = torn_record_ = 0;
  uint64_t off = kHeader;
  uint32_t len;
  auto fetch = [this](uint64_t at, uint64_t n) { return bytes(at, n); };
  while (frame_ok(off, &len, fetch)) {
    records_.emplace_back(off + 8, len);
    off += 8 + pad8(len);
  }
  if (valid_frame_after(off))
    throw CorruptLog("op log " + path_ + " has a corrupt record at byte offset " + std::to_string(off) +
                     " followed by valid records; refusing to skip it", off);
  uint64_t header = 0;
  if (const uint8_t* h = bytes(off, 8)) std::memcpy(&header, h, 8);
  if (header != 0) {
    if (!torn_at(off))
      throw CorruptLog("op log " + path_ + ": its last record, at byte offset " + std::to_string(off) +
                       ", fails its checksum and was not torn by a crash; refusing to drop it", off);
    torn_record_ = size_ - off;
  }
  end_ = synced_to_ = off;
}

void OpLog::reserve(uint64_t extra) {
  if (end_ + extra <= cap_) return;
  const uint64_t need = round_up(end_ + extra, kGrow);
  uint64_t want = std::max(need, round_up(cap_ + std::min(std::max(cap_, kGrow), kMaxGrow), kGrow));
  // Blocks first, then the mapping: on a full disk fallocate fails here, before any byte is written,
  // whereas a page of a sparse mapping fails only when touched, as a SIGBUS.
  int e = ::posix_fallocate(fd_, static_cast<off_t>(cap_), static_cast<off_t>(want - cap_));
  if (e && want > need) {  // a nearly full disk may still hold what this record needs
    want = need;
    e = ::posix_fallocate(fd_, static_cast<off_t>(cap_), static_cast<off_t>(want - cap_));
  }
  if (e)
    throw IoError(e, "bank " + bank_of(path_) + ": cannot reserve " + std::to_string(want - cap_) +
                     " bytes for its op log " + path_ + ": " + std::strerror(e) + "; the op was not applied");
  void* m = ::mremap(map_, cap_, want, MREMAP_MAYMOVE);
  if (m == MAP_FAILED) throw IoError(errno, os_error("cannot remap op log", path_, errno));
  map_ = static_cast<uint8_t*>(m);
  // Fault the new pages in now, so appends don't pay a page fault every few records (the p50 target).
  const uint64_t old_cap = cap_;
  cap_ = want;
#ifdef MADV_POPULATE_WRITE
  const uint64_t from = old_cap / 4096 * 4096;
  // Populating is only a speed-up (the blocks are reserved either way), so only EINVAL, an older
  // kernel, falls through to touching the pages by hand.
  if (::madvise(map_ + from, want - from, MADV_POPULATE_WRITE) == 0 || errno != EINVAL) return;
#endif
  for (uint64_t p = old_cap; p < want; p += 4096) map_[p] = 0;  // new pages: fallocate made them zeros
}

void OpLog::append_frame(const std::string& rec) {
  const uint32_t len = static_cast<uint32_t>(rec.size());
  std::memcpy(map_ + end_ + 8, rec.data(), len);
  uint32_t crc = crc32c(crc32c(0, &len, 4), rec.data(), len);
  uint64_t header = uint64_t(len) | (uint64_t(crc) << 32);
  __atomic_store_n(reinterpret_cast<uint64_t*>(map_ + end_), header, __ATOMIC_RELEASE);
  end_ += 8 + pad8(len);
}

// A failed sync takes the new frames back (zeroes them), so the log never holds an op whose apply raised.
void OpLog::sync_or_take_back(uint64_t start) {
  try {
    sync();
  } catch (...) {
    std::memset(map_ + start, 0, end_ - start);
    end_ = start;
    synced_to_ = std::min(synced_to_, start);
    throw;
  }
}

namespace {
void check_size(const std::string& rec) {  // never write a record that an open would take for damage
  if (rec.size() > OpLog::kMaxRecord)
    throw BadInput("an op record of " + std::to_string(rec.size()) + " bytes, over the op log's limit of " +
                   std::to_string(OpLog::kMaxRecord));
}
}  // namespace

void OpLog::put(const std::string& rec) {
  if (!writable_ || !map_) throw std::runtime_error("op log " + path_ + " is not open for writing");
  check_owner();
  check_size(rec);
  reserve(8 + pad8(rec.size()));
  const uint64_t start = end_;
  append_frame(rec);
  if (sync_ == EVERY_OP || (sync_ == EVERY_N && ++unsynced_ >= sync_every_)) sync_or_take_back(start);
}

void OpLog::put_batch(const BatchBuffer& b) {
  if (!writable_ || !map_) throw std::runtime_error("op log " + path_ + " is not open for writing");
  check_owner();
  uint64_t total = 0;
  for (const auto& rec : b.records) {
    check_size(rec);
    total += 8 + pad8(rec.size());
  }
  reserve(total);  // all of the batch or none of it
  const uint64_t start = end_;
  for (const auto& rec : b.records) append_frame(rec);
  unsynced_ += static_cast<int64_t>(b.records.size());
  if (sync_ == EVERY_OP || (sync_ == EVERY_N && unsynced_ >= sync_every_)) sync_or_take_back(start);
}

void OpLog::sync() {
  if (!writable_ || !map_ || forked()) return;
  // Only the pages written since the last sync; msync wants a page-aligned start.
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t from = synced_to_ / page * page;
  if (end_ > from && ::msync(map_ + from, end_ - from, MS_SYNC) != 0)
    throw IoError(errno, "bank " + bank_of(path_) + ": " + os_error("cannot sync op log", path_, errno));
  synced_to_ = end_;
  unsynced_ = 0;
}

// Unmaps and closes even when the final sync fails; that failure is raised afterwards.
void OpLog::close() {
  if (!map_) return;
  std::exception_ptr failed;
  if (writable_ && forked()) {
    ::munmap(map_, cap_);  // this process's mapping only; the file is the parent's
  } else if (writable_) {
    try { if (sync_ != NEVER) sync(); } catch (...) { failed = std::current_exception(); }
    ::munmap(map_, cap_);
    // Trim the reserved zeros: the next open scans only real frames, and the space goes back. No
    // reader maps the log (they copy it), so shrinking it cannot fault anyone.
    if (::ftruncate(fd_, static_cast<off_t>(end_)) == 0 && sync_ != NEVER) ::fsync(fd_);
  } else {
    std::vector<uint8_t>().swap(copy_);
  }
  map_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (failed) std::rethrow_exception(failed);
}

}  // namespace memr1
