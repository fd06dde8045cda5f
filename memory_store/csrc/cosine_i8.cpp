// The i8 cosine kernels (cosine_i8.h), picked for this CPU at load time.
#include "cosine_i8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define MEMR1_AMX 1
#endif

namespace memr1 {

I8Sums i8_sums(const int8_t* b, size_t dim) {
  I8Sums s;
  for (size_t i = 0; i < dim; ++i) s.sq += int32_t(b[i]) * b[i], s.sum += b[i];
  s.norm = std::sqrt(static_cast<float>(s.sq));
  return s;
}

void QueryI8::set(const int8_t* data, size_t dim) {
  a.assign(data, data + dim);
  shifted.resize(dim);
  sq = 0;
  for (size_t i = 0; i < dim; ++i) {
    shifted[i] = static_cast<uint8_t>(int32_t(a[i]) + 128);
    sq += int32_t(a[i]) * a[i];
  }
  norm = std::sqrt(static_cast<float>(sq));
}

float cos_i8_reference(const int8_t* a, const int8_t* b, size_t dim) {
  int32_t ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < dim; ++i) ab += int32_t(a[i]) * b[i], aa += int32_t(a[i]) * a[i], bb += int32_t(b[i]) * b[i];
  return cos_from_sums(ab, aa, std::sqrt(static_cast<float>(aa)), bb, std::sqrt(static_cast<float>(bb)));
}

namespace {
int32_t dot_scalar(const QueryI8& q, const int8_t* b, int32_t, size_t dim) {
  int32_t s = 0;
  for (size_t i = 0; i < dim; ++i) s += int32_t(q.a[i]) * b[i];
  return s;
}
#if defined(__x86_64__)
// Sign-extend 16 bytes to 16-bit lanes; each multiply-add sums lane pairs into 32 bits, exactly.
__attribute__((target("avx2"))) int32_t dot_avx2(const QueryI8& q, const int8_t* b, int32_t, size_t dim) {
  const int8_t* a = q.a.data();
  __m256i acc = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256i y = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(x, y));
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  int32_t s = 0;
  for (int32_t x : lanes) s += x;
  for (; i < dim; ++i) s += int32_t(a[i]) * b[i];
  return s;
}
// 64 u8 x i8 products per instruction, summed four at a time into 32-bit lanes without saturation; the
// tail is a masked load (zeros past the end). The sums wrap in uint32: the true a.b fits in int32, so the
// wrapped total is exact.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int32_t dot_vnni(const QueryI8& q, const int8_t* b,
                                                                        int32_t b_sum, size_t dim) {
  const uint8_t* a = q.shifted.data();
  __m512i acc0 = _mm512_setzero_si512(), acc1 = acc0;
  size_t i = 0;
  for (; i + 128 <= dim; i += 128) {
    acc0 = _mm512_dpbusd_epi32(acc0, _mm512_loadu_si512(a + i), _mm512_loadu_si512(b + i));
    acc1 = _mm512_dpbusd_epi32(acc1, _mm512_loadu_si512(a + i + 64), _mm512_loadu_si512(b + i + 64));
  }
  for (; i + 64 <= dim; i += 64) acc0 = _mm512_dpbusd_epi32(acc0, _mm512_loadu_si512(a + i), _mm512_loadu_si512(b + i));
  if (i < dim) {
    const __mmask64 m = (uint64_t(1) << (dim - i)) - 1;
    acc0 = _mm512_dpbusd_epi32(acc0, _mm512_maskz_loadu_epi8(m, a + i), _mm512_maskz_loadu_epi8(m, b + i));
  }
  const uint32_t shifted = static_cast<uint32_t>(_mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1)));
  return static_cast<int32_t>(shifted - 128u * static_cast<uint32_t>(b_sum));
}
// QB queries x R rows per pass (R = 4, and 1 for the last rows); the tail of a row is a masked load, as
// in dot_vnni. The sums wrap in uint32; the true a.b fits in int32, so the wrapped total is exact.
template <int QB, int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void block_vnni(const uint8_t* a, const int8_t* b,
                                                                       const int32_t* sums, int64_t n,
                                                                       size_t stride, size_t dim, int32_t* out) {
  const size_t full = dim / 64 * 64;
  __m512i acc[QB][R];
  for (int q = 0; q < QB; ++q)
    for (int j = 0; j < R; ++j) acc[q][j] = _mm512_setzero_si512();
  for (size_t i = 0; i < full; i += 64) {
    __m512i y[R];
    for (int j = 0; j < R; ++j) y[j] = _mm512_loadu_si512(b + j * stride + i);
    for (int q = 0; q < QB; ++q) {
      const __m512i x = _mm512_loadu_si512(a + q * stride + i);
      for (int j = 0; j < R; ++j) acc[q][j] = _mm512_dpbusd_epi32(acc[q][j], x, y[j]);
    }
  }
  if (full < dim) {
    const __mmask64 tail = (uint64_t(1) << (dim - full)) - 1;
    __m512i y[R];
    for (int j = 0; j < R; ++j) y[j] = _mm512_maskz_loadu_epi8(tail, b + j * stride + full);
    for (int q = 0; q < QB; ++q) {
      const __m512i x = _mm512_maskz_loadu_epi8(tail, a + q * stride + full);
      for (int j = 0; j < R; ++j) acc[q][j] = _mm512_dpbusd_epi32(acc[q][j], x, y[j]);
    }
  }
  for (int q = 0; q < QB; ++q)
    for (int j = 0; j < R; ++j)
      out[q * n + j] = static_cast<int32_t>(static_cast<uint32_t>(_mm512_reduce_add_epi32(acc[q][j])) -
                                            128u * static_cast<uint32_t>(sums[j]));
}
// QB queries against every row.
template <int QB>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void rows_vnni(const uint8_t* a, const int8_t* rows,
                                                                      const int32_t* sums, int64_t n,
                                                                      size_t stride, size_t dim, int32_t* out) {
  int64_t r = 0;
  for (; r + 4 <= n; r += 4) block_vnni<QB, 4>(a, rows + r * stride, sums + r, n, stride, dim, out + r);
  for (; r < n; ++r) block_vnni<QB, 1>(a, rows + r * stride, sums + r, n, stride, dim, out + r);
}
bool has_vnni() { return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"); }
#endif
}  // namespace

std::vector<std::pair<std::string, DotI8>> dot_i8_kernels() {
  std::vector<std::pair<std::string, DotI8>> out{{"scalar", dot_scalar}};
#if defined(__x86_64__)
  __builtin_cpu_init();  // this runs from a static initialiser (dot_i8, below)
  if (__builtin_cpu_supports("avx2")) out.emplace_back("avx2", dot_avx2);
  if (has_vnni()) out.emplace_back("avx512_vnni", dot_vnni);
#endif
  return out;
}

const DotI8 dot_i8 = dot_i8_kernels().back().second;

std::vector<std::pair<std::string, float>> cos_i8_kernels(const int8_t* a, const int8_t* b, size_t dim) {
  std::vector<std::pair<std::string, float>> out{{"reference", cos_i8_reference(a, b, dim)}};
  QueryI8 q;
  q.set(a, dim);
  const I8Sums sums = i8_sums(b, dim);
  for (const auto& [name, dot] : dot_i8_kernels())
    out.emplace_back(name, cos_from_sums(dot(q, b, sums.sum, dim), q, sums));
  return out;
}

namespace {
// One of the walk's pair kernels per (query, row), each query's code back in i8 first (a = shifted - 128,
// one XOR): the scalar loop anywhere, AVX2 on CPUs without VNNI.
template <DotI8 dot>
void many_pairs(const uint8_t* shifted, size_t m, const int8_t* rows, const int32_t* sums, int64_t n,
                size_t stride, size_t dim, int32_t* out) {
  QueryI8 q;
  q.a.resize(dim);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < dim; ++j) q.a[j] = static_cast<int8_t>(shifted[i * stride + j] ^ 0x80u);
    for (int64_t r = 0; r < n; ++r) out[i * n + r] = dot(q, rows + r * stride, sums[r], dim);
  }
}
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void many_vnni(const uint8_t* shifted, size_t m,
                                                                      const int8_t* rows, const int32_t* sums,
                                                                      int64_t n, size_t stride, size_t dim,
                                                                      int32_t* out) {
  size_t i = 0;
  for (; i + 4 <= m; i += 4) rows_vnni<4>(shifted + i * stride, rows, sums, n, stride, dim, out + i * n);
  for (; i < m; ++i) rows_vnni<1>(shifted + i * stride, rows, sums, n, stride, dim, out + i * n);
}
#endif
#if defined(MEMR1_AMX)
// AMX: one tile product multiplies 16 rows by 16 queries over 64 bytes of the dimension (s8 x s8, so
// each query goes back to i8 and no sum is subtracted). The queries are packed once per call the way
// the B operand wants them: per 64 bytes of the dimension, 16 lines of 4 bytes per query. The dimension
// is padded to 64 with zero query bytes, so what a row's padding reads adds nothing; the last rows,
// whose padding would read past the end, are copied into a zeroed block first. Fewer than 8 queries go
// to the VNNI kernel (every AMX CPU has VNNI).
struct TileConfig {  // the layout _tile_loadconfig reads: palette 1, then bytes per line and lines per tile
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
// 16 rows (a, a_stride apart) against NQ blocks of 16 packed queries (b, kp * 16 bytes apart) into
// c[t * 256 + row * 16 + query]: the rows' tile (tmm4) is loaded once per 64 bytes for every block.
template <int NQ>
__attribute__((target("amx-tile,amx-int8"))) void tiles_amx(const int8_t* a, size_t a_stride, const int8_t* b,
                                                            size_t kp, int32_t* c) {
  const size_t block = kp * 16;
  _tile_zero(0);
  if constexpr (NQ > 1) _tile_zero(1);
  if constexpr (NQ > 2) _tile_zero(2);
  if constexpr (NQ > 3) _tile_zero(3);
  for (size_t k = 0; k < kp; k += 64) {
    _tile_loadd(4, a + k, a_stride);
    _tile_loadd(5, b + k * 16, 64);
    _tile_dpbssd(0, 4, 5);
    if constexpr (NQ > 1) { _tile_loadd(6, b + block + k * 16, 64); _tile_dpbssd(1, 4, 6); }
    if constexpr (NQ > 2) { _tile_loadd(7, b + 2 * block + k * 16, 64); _tile_dpbssd(2, 4, 7); }
    if constexpr (NQ > 3) { _tile_loadd(5, b + 3 * block + k * 16, 64); _tile_dpbssd(3, 4, 5); }
  }
  _tile_stored(0, c, 64);
  if constexpr (NQ > 1) _tile_stored(1, c + 256, 64);
  if constexpr (NQ > 2) _tile_stored(2, c + 512, 64);
  if constexpr (NQ > 3) _tile_stored(3, c + 768, 64);
}
__attribute__((target("amx-tile,amx-int8"))) void many_amx(const uint8_t* shifted, size_t m, const int8_t* rows,
                                                           const int32_t* sums, int64_t n, size_t stride, size_t dim,
                                                           int32_t* out) {
  if (m < 8) return many_vnni(shifted, m, rows, sums, n, stride, dim, out);  // tiles would be mostly padding
  const size_t kp = (dim + 63) / 64 * 64, blocks = (m + 15) / 16;
  std::vector<int8_t> packed(blocks * kp * 16, 0), last(16 * kp);
  for (size_t i = 0; i < m; ++i) {  // 4 bytes at a time, each back in i8 by one XOR of its top bit
    int8_t* dst = packed.data() + (i / 16) * kp * 16 + (i % 16) * 4;
    const uint8_t* src = shifted + i * stride;
    size_t k = 0;
    for (uint32_t word; k + 4 <= dim; k += 4) {
      std::memcpy(&word, src + k, 4);
      word ^= 0x80808080u;
      std::memcpy(dst + k * 16, &word, 4);
    }
    for (; k < dim; ++k) dst[(k / 4) * 64 + k % 4] = static_cast<int8_t>(src[k] ^ 0x80u);
  }
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  alignas(64) int32_t c[4 * 256];
  const size_t end = static_cast<size_t>(n) * stride;
  for (int64_t r = 0; r < n; r += 16) {
    const int64_t nr = std::min<int64_t>(16, n - r);
    const int8_t* a = rows + r * stride;
    size_t a_stride = stride;
    // A tile reads 16 lines of kp bytes; copy when that would pass the rows' end (a part-filled block
    // always would).
    if ((r + 15) * stride + kp > end) {
      std::fill(last.begin(), last.end(), 0);
      for (int64_t j = 0; j < nr; ++j) std::copy(a + j * stride, a + j * stride + dim, last.data() + j * kp);
      a = last.data(), a_stride = kp;
    }
    for (size_t qb = 0; qb < blocks; qb += 4) {
      const size_t nq = std::min<size_t>(4, blocks - qb);
      const int8_t* b = packed.data() + qb * kp * 16;
      if (nq == 4) tiles_amx<4>(a, a_stride, b, kp, c);
      else if (nq == 3) tiles_amx<3>(a, a_stride, b, kp, c);
      else if (nq == 2) tiles_amx<2>(a, a_stride, b, kp, c);
      else tiles_amx<1>(a, a_stride, b, kp, c);
      for (size_t t = 0; t < nq; ++t)
        for (size_t x = 0, q = (qb + t) * 16; x < 16 && q < m; ++x, ++q)
          for (int64_t j = 0; j < nr; ++j) out[q * n + r + j] = c[t * 256 + j * 16 + x];
    }
  }
  _tile_release();
}
// The CPU has AMX-TILE and AMX-INT8 (CPUID 7.0, EDX bits 24 and 25), and Linux grants this process the
// tile state (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA), which it withholds until asked.
bool has_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
#endif
}  // namespace

std::vector<std::pair<std::string, DotsI8Many>> dots_i8_many_kernels() {
  std::vector<std::pair<std::string, DotsI8Many>> out{{"scalar", many_pairs<dot_scalar>}};
#if defined(__x86_64__)
  __builtin_cpu_init();  // this runs from a static initialiser (dots_i8_many, below)
  if (__builtin_cpu_supports("avx2")) out.emplace_back("avx2", many_pairs<dot_avx2>);
  if (has_vnni()) out.emplace_back("avx512_vnni", many_vnni);
#endif
#if defined(MEMR1_AMX)
  if (has_vnni() && has_amx()) out.emplace_back("amx", many_amx);  // AMX hands few queries to VNNI
#endif
  return out;
}

const DotsI8Many dots_i8_many = dots_i8_many_kernels().back().second;

}  // namespace memr1
