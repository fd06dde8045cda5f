// The i8 cosine kernels (cosine_i8.h), picked for this CPU at load time.
#include "cosine_i8.h"

#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
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
}  // namespace

std::vector<std::pair<std::string, DotsI8Many>> dots_i8_many_kernels() {
  std::vector<std::pair<std::string, DotsI8Many>> out{{"scalar", many_pairs<dot_scalar>}};
#if defined(__x86_64__)
  __builtin_cpu_init();  // this runs from a static initialiser (dots_i8_many, below)
  if (__builtin_cpu_supports("avx2")) out.emplace_back("avx2", many_pairs<dot_avx2>);
  if (has_vnni()) out.emplace_back("avx512_vnni", many_vnni);
#endif
  return out;
}

const DotsI8Many dots_i8_many = dots_i8_many_kernels().back().second;

}  // namespace memr1
