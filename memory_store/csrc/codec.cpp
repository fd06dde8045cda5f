// CRC32C and the msgpack encoding of op records (the two pure functions the op log is built from).
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
void mp_array(std::string& o, size_t n) {
  if (n < 16) o.push_back(static_cast<char>(0x90 | n));
  else if (n <= 0xffff) { o.push_back('\xdc'); put_be(o, n, 2); }
  else { o.push_back('\xdd'); put_be(o, n, 4); }
}
// The optional trailing element: absent when empty (see core.h).
void mp_sources(std::string& o, const Sources& sources) {
  if (sources.empty()) return;
  mp_array(o, sources.size());
  for (const std::string& s : sources) mp_str(o, s);
}
}  // namespace

// Each record is a tagged array, the msgspec encoding of `array_like=True, tag=...` Structs.
std::string encode_add(int64_t id, const std::string& text, const std::string& speaker, const std::string& ts,
                       const float* vec, int dim, const Sources& sources) {
  std::string o;
  o.reserve(32 + text.size() + speaker.size() + ts.size() + 4 * dim + sources.size() * (kMaxSourceBytes + 2));
  mp_array(o, sources.empty() ? 6 : 7);
  mp_str(o, "add");
  mp_uint(o, static_cast<uint64_t>(id));
  mp_str(o, text);
  mp_str(o, speaker);
  mp_str(o, ts);
  mp_bin(o, vec, sizeof(float) * dim);
  mp_sources(o, sources);
  return o;
}
std::string encode_update(int64_t id, const std::string& text, const std::string* ts, const float* vec, int dim,
                          const Sources& sources) {
  std::string o;
  o.reserve(32 + text.size() + 4 * dim + sources.size() * (kMaxSourceBytes + 2));
  mp_array(o, sources.empty() ? 5 : 6);
  mp_str(o, "update");
  mp_uint(o, static_cast<uint64_t>(id));
  mp_str(o, text);
  if (ts) mp_str(o, *ts); else o.push_back('\xc0');
  mp_bin(o, vec, sizeof(float) * dim);
  mp_sources(o, sources);
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

}  // namespace memr1
