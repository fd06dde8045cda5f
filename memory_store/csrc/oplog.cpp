// The op log: a memory-mapped, append-only file of checksummed msgpack records.
//
// File:   [32-byte header: "MEMR1LOG", u32 version, u32 0, u64 generation, u64 0][frame]...
// Frame:  [u32 length][u32 crc32c(length || payload)][payload][zero padding to 8 bytes]
// The payload is written first and the 8-byte header last, as one aligned store, so a process killed
// mid-append leaves either a whole frame or a zero header. Writes land in the page cache through the
// shared mapping, so they survive a killed process whatever the fsync policy; fsync is about power loss.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace memr1 {

// ---- CRC32C: SSE4.2 instruction where present, a table otherwise ----
namespace {
uint32_t crc_table[256];
bool init_table() {
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    crc_table[i] = c;
  }
  return true;
}
const bool table_ready = init_table();

uint32_t crc_sw(uint32_t crc, const uint8_t* p, size_t n) {
  crc = ~crc;
  while (n--) crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}
#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_hw(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}
const bool has_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (has_sse42) return crc_hw(crc, static_cast<const uint8_t*>(data), n);
#endif
  return crc_sw(crc, static_cast<const uint8_t*>(data), n);
}

// ---- msgpack, just the subset our records use ----
namespace {
void put_be(std::string& o, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) o.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void mp_uint(std::string& o, uint64_t v) {
  if (v < 128) o.push_back(static_cast<char>(v));
  else if (v <= 0xff) { o.push_back('\xcc'); put_be(o, v, 1); }
  else if (v <= 0xffff) { o.push_back('\xcd'); put_be(o, v, 2); }
  else if (v <= 0xffffffffULL) { o.push_back('\xce'); put_be(o, v, 4); }
  else { o.push_back('\xcf'); put_be(o, v, 8); }
}
void mp_str(std::string& o, const std::string& s) {
  size_t n = s.size();
  if (n < 32) o.push_back(static_cast<char>(0xa0 | n));
  else if (n <= 0xff) { o.push_back('\xd9'); put_be(o, n, 1); }
  else if (n <= 0xffff) { o.push_back('\xda'); put_be(o, n, 2); }
  else { o.push_back('\xdb'); put_be(o, n, 4); }
  o.append(s);
}
void mp_bin(std::string& o, const void* p, size_t n) {
  if (n <= 0xff) { o.push_back('\xc4'); put_be(o, n, 1); }
  else if (n <= 0xffff) { o.push_back('\xc5'); put_be(o, n, 2); }
  else { o.push_back('\xc6'); put_be(o, n, 4); }
  o.append(static_cast<const char*>(p), n);
}
}  // namespace

// Each record is a tagged array, the msgspec encoding of `array_like=True, tag=...` Structs.
std::string encode_add(int64_t id, const std::string& text, const std::string& speaker, const std::string& ts,
                       const float* vec, int dim) {
  std::string o;
  o.reserve(32 + text.size() + speaker.size() + ts.size() + 4 * dim);
  o.push_back('\x96');
  mp_str(o, "add");
  mp_uint(o, static_cast<uint64_t>(id));
  mp_str(o, text);
  mp_str(o, speaker);
  mp_str(o, ts);
  mp_bin(o, vec, sizeof(float) * dim);
  return o;
}
std::string encode_update(int64_t id, const std::string& text, const std::string* ts, const float* vec, int dim) {
  std::string o;
  o.reserve(32 + text.size() + 4 * dim);
  o.push_back('\x95');
  mp_str(o, "update");
  mp_uint(o, static_cast<uint64_t>(id));
  mp_str(o, text);
  if (ts) mp_str(o, *ts); else o.push_back('\xc0');
  mp_bin(o, vec, sizeof(float) * dim);
  return o;
}
std::string encode_delete(int64_t id) {
  std::string o("\x92", 1);
  mp_str(o, "delete");
  mp_uint(o, static_cast<uint64_t>(id));
  return o;
}
std::string encode_noop() {
  std::string o("\x91", 1);
  mp_str(o, "noop");
  return o;
}

// ---- the log file ----
namespace {
constexpr char kMagic[8] = {'M', 'E', 'M', 'R', '1', 'L', 'O', 'G'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeader = 32;
constexpr uint64_t kGrow = 1 << 20;
uint64_t pad8(uint64_t n) { return (n + 7) & ~uint64_t(7); }
std::string os_error(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}
// A frame at `off` is valid when its length fits in `size` and its checksum matches.
bool frame_ok(const uint8_t* m, uint64_t size, uint64_t off, uint32_t* len_out) {
  if (off + 8 > size) return false;
  uint32_t len, crc;
  std::memcpy(&len, m + off, 4);
  std::memcpy(&crc, m + off + 4, 4);
  if (len == 0 || off + 8 + pad8(len) > size) return false;
  uint32_t c = crc32c(0, &len, 4);
  if (crc32c(c, m + off + 8, len) != crc) return false;
  *len_out = len;
  return true;
}
}  // namespace

void OpLog::create(const std::string& path, uint64_t generation) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
  if (fd < 0) throw std::runtime_error(os_error("cannot create op log", path));
  uint8_t h[kHeader] = {};
  std::memcpy(h, kMagic, 8);
  std::memcpy(h + 8, &kVersion, 4);
  std::memcpy(h + 16, &generation, 8);
  bool ok = ::write(fd, h, kHeader) == (ssize_t)kHeader && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error(os_error("cannot write op log", path));
}

OpLog::OpLog(const std::string& path, bool writable, int sync, int64_t sync_every)
    : path_(path), writable_(writable), sync_(sync), sync_every_(sync_every < 1 ? 1 : sync_every) {
  fd_ = ::open(path.c_str(), writable ? O_RDWR : O_RDONLY);
  if (fd_ < 0) throw std::runtime_error(os_error("cannot open op log", path));
  struct stat st;
  if (::fstat(fd_, &st) != 0) throw std::runtime_error(os_error("cannot stat op log", path));
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHeader) { ::close(fd_); fd_ = -1; throw LogFormat("op log " + path + " is shorter than its header"); }
  cap_ = size;
  int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* m = ::mmap(nullptr, cap_, prot, MAP_SHARED, fd_, 0);
  if (m == MAP_FAILED) { ::close(fd_); fd_ = -1; throw std::runtime_error(os_error("cannot map op log", path)); }
  map_ = static_cast<uint8_t*>(m);
  uint32_t version;
  std::memcpy(&version, map_ + 8, 4);
  if (std::memcmp(map_, kMagic, 8) != 0 || version != kVersion) {
    close();
    throw LogFormat("op log " + path + " is not a memr1 op log of version " + std::to_string(kVersion));
  }
  std::memcpy(&generation_, map_ + 16, 8);
  scan();
}

OpLog::~OpLog() { try { close(); } catch (...) {} }

// Walk the frames. The first invalid frame ends the log if nothing valid follows it (a torn tail,
// which is dropped); if a valid frame follows, the log is corrupt in the middle and we refuse it.
void OpLog::scan() {
  uint64_t off = kHeader;
  uint32_t len;
  while (frame_ok(map_, cap_, off, &len)) {
    records_.emplace_back(off + 8, len);
    off += 8 + pad8(len);
  }
  for (uint64_t probe = off + 8; probe + 8 <= cap_; probe += 8) {
    uint64_t word;
    std::memcpy(&word, map_ + probe, 8);
    if (word != 0 && frame_ok(map_, cap_, probe, &len))
      throw CorruptLog("op log " + path_ + " has a corrupt record at byte offset " + std::to_string(off) +
                       " followed by valid records; refusing to skip it", off);
  }
  end_ = synced_to_ = off;
  for (uint64_t i = off; i < cap_; ++i)
    if (map_[i]) { dropped_tail_ = cap_ - off; break; }
  if (writable_ && dropped_tail_) std::memset(map_ + off, 0, cap_ - off);  // so appends start clean
}

void OpLog::reserve(uint64_t extra) {
  if (end_ + extra <= cap_) return;
  uint64_t want = std::max(cap_ * 2, end_ + extra + kGrow);
  want = (want + kGrow - 1) / kGrow * kGrow;
  if (::ftruncate(fd_, static_cast<off_t>(want)) != 0) throw std::runtime_error(os_error("cannot grow op log", path_));
  void* m = ::mremap(map_, cap_, want, MREMAP_MAYMOVE);
  if (m == MAP_FAILED) throw std::runtime_error(os_error("cannot remap op log", path_));
  map_ = static_cast<uint8_t*>(m);
  // Fault the new pages in now, so appends don't pay a page fault every few records (the p50 target).
#ifdef MADV_POPULATE_WRITE
  if (::madvise(map_ + cap_ / 4096 * 4096, want - cap_ / 4096 * 4096, MADV_POPULATE_WRITE) != 0)
#endif
  {
    for (uint64_t p = cap_; p < want; p += 4096) map_[p] = 0;
  }
  cap_ = want;
}

void OpLog::append_frame(const std::string& rec) {
  const uint32_t len = static_cast<uint32_t>(rec.size());
  reserve(8 + pad8(len));
  std::memcpy(map_ + end_ + 8, rec.data(), len);
  uint32_t crc = crc32c(crc32c(0, &len, 4), rec.data(), len);
  uint64_t header = uint64_t(len) | (uint64_t(crc) << 32);
  __atomic_store_n(reinterpret_cast<uint64_t*>(map_ + end_), header, __ATOMIC_RELEASE);
  end_ += 8 + pad8(len);
}

void OpLog::put(const std::string& rec) {
  if (!writable_ || !map_) throw std::runtime_error("op log " + path_ + " is not open for writing");
  append_frame(rec);
  if (sync_ == EVERY_OP || (sync_ == EVERY_N && ++unsynced_ >= sync_every_)) sync();
}

void OpLog::put_batch(const BatchBuffer& b) {
  if (!writable_ || !map_) throw std::runtime_error("op log " + path_ + " is not open for writing");
  for (const auto& rec : b.records) append_frame(rec);
  unsynced_ += static_cast<int64_t>(b.records.size());
  if (sync_ == EVERY_OP || (sync_ == EVERY_N && unsynced_ >= sync_every_)) sync();
}

void OpLog::sync() {
  if (!writable_ || !map_) return;
  // Only the pages written since the last sync; msync wants a page-aligned start.
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t from = synced_to_ / page * page;
  if (end_ > from && ::msync(map_ + from, end_ - from, MS_SYNC) != 0)
    throw std::runtime_error(os_error("cannot sync op log", path_));
  synced_to_ = end_;
  unsynced_ = 0;
}

void OpLog::close() {
  if (!map_) return;
  if (writable_) {
    if (sync_ != NEVER) sync();
    ::munmap(map_, cap_);
    map_ = nullptr;
    // Trim the preallocated zeros so the next open scans only real frames.
    if (::ftruncate(fd_, static_cast<off_t>(end_)) == 0 && sync_ != NEVER) ::fsync(fd_);
  } else {
    ::munmap(map_, cap_);
    map_ = nullptr;
  }
  ::close(fd_);
  fd_ = -1;
}

}  // namespace memr1
