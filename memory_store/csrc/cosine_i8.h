// The i8 cosine distance of the bank's default graphs, as usearch defines it (metric_cos_i8: exact int32
// sums a.b, a.a, b.b, then 1 - ab / (sqrt(aa) sqrt(bb))), computed the way a walk needs it: b.b and the
// sum of b are made once per graph node (I8Sums) and a.a once per query (QueryI8), so each distance is
// one dot product. Every kernel gives the same integer dot product, so the distance is the same bit for
// bit whichever kernel this CPU runs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace memr1 {

struct I8Sums {  // of one node's vector: b.b, sum(b) and sqrt(b.b) as cos_from_sums takes it
  int32_t sq = 0, sum = 0;
  float norm = 0.f;
};
I8Sums i8_sums(const int8_t* b, size_t dim);

// A query cast to i8 (`a`), with a + 128 as u8 (`shifted`: AVX-512 VNNI multiplies u8 by i8, and
// sum((a + 128) b) = a.b + 128 sum(b)) and a.a. Owns its bytes; `set` reuses them between queries.
struct QueryI8 {
  std::vector<int8_t> a;
  std::vector<uint8_t> shifted;
  int32_t sq = 0;
  float norm = 0.f;
  void set(const int8_t* data, size_t dim);
};

// usearch's metric_cos_i8 from a.b, a.a, b.b and the square roots of the floats of a.a and b.b.
inline float cos_from_sums(int32_t ab, int32_t aa, float a_norm, int32_t bb, float b_norm) {
  if (aa == 0 && bb == 0) return 0.f;
  if (ab == 0) return 1.f;
  const float d = 1.f - static_cast<float>(ab) / (a_norm * b_norm);
  return d < 0.f ? 0.f : d;
}
// The walk's form: the square roots taken beforehand, per query and per node.
inline float cos_from_sums(int32_t ab, const QueryI8& a, const I8Sums& b) {
  return cos_from_sums(ab, a.sq, a.norm, b.sq, b.norm);
}
// The distance from the plain three-sum loop: the reference every kernel must equal.
float cos_i8_reference(const int8_t* a, const int8_t* b, size_t dim);

// a.b of a query and a node vector (`b_sum`: the node's I8Sums::sum).
using DotI8 = int32_t (*)(const QueryI8& q, const int8_t* b, int32_t b_sum, size_t dim);
extern const DotI8 dot_i8;  // the fastest kernel this CPU runs
// Every kernel this CPU runs, by name ("scalar", "avx2", "avx512_vnni"), for the tests.
std::vector<std::pair<std::string, DotI8>> dot_i8_kernels();

// a_i.b_r for m queries and n rows into out[i * n + r]: query i as a + 128 in u8 at shifted + i * stride,
// row r at rows + r * stride with sum(b_r) at sums[r]. Exact integers, as dot_i8 gives them; on VNNI
// CPUs 4 queries x 4 rows per pass, so that each load of either side feeds four products; on AMX CPUs
// tile products of 16 rows x 16 queries.
using DotsI8Many = void (*)(const uint8_t* shifted, size_t m, const int8_t* rows, const int32_t* sums, int64_t n,
                           size_t stride, size_t dim, int32_t* out);
extern const DotsI8Many dots_i8_many;  // the fastest kernel this CPU runs
// Every kernel this CPU runs, by name ("scalar", "avx2", "avx512_vnni", "amx"), for the tests.
std::vector<std::pair<std::string, DotsI8Many>> dots_i8_many_kernels();

// The distance of a and b: the plain three-sum loop ("reference"), then each kernel as the walk uses it.
std::vector<std::pair<std::string, float>> cos_i8_kernels(const int8_t* a, const int8_t* b, size_t dim);

}  // namespace memr1
