// Exact search of a bank state: a dot product picked for this CPU at load time, a top-k heap, and
// State::search over the base rows (all of them, or HNSW candidates) and the delta. See core.h.
#include <algorithm>
#include <limits>
#include <vector>

#include "core.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace memr1 {

namespace {
float dot_default(const float* a, const float* b, int n) {
  float s[8] = {0};  // independent partial sums: vectorisable without -ffast-math
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float t = 0;
  for (; i < n; ++i) t += a[i] * b[i];
  for (float x : s) t += x;
  return t;
}
#if defined(__x86_64__)
// Four accumulators hide the FMA latency; picked at load time, so one binary serves every x86-64.
__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * j), _mm256_loadu_ps(b + i + 8 * j), acc[j]);
  __m256 v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  float lanes[8];
  _mm256_storeu_ps(lanes, v);
  float t = 0;
  for (float x : lanes) t += x;
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}
__attribute__((target("avx512f"))) float dot_avx512(const float* a, const float* b, int n) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int i = 0;
  for (; i + 64 <= n; i += 64)
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16 * j), _mm512_loadu_ps(b + i + 16 * j), acc[j]);
  for (; i + 16 <= n; i += 16) acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc[0]);
  float t = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}
#endif
using DotFn = float (*)(const float*, const float*, int);
DotFn pick_dot() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return dot_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return dot_avx2;
#endif
  return dot_default;
}
const DotFn dot = pick_dot();

}  // namespace

struct TopK {  // min-heap of the best k hits
  explicit TopK(int k) : k(k) { heap.reserve(k); }
  int k;
  std::vector<Hit> heap;
  struct Worse {  // a functor, so that the heap's comparisons inline
    bool operator()(const Hit& a, const Hit& b) const {
      return a.score > b.score || (a.score == b.score && a.id < b.id);
    }
  };
  bool admits(float s) const { return (int)heap.size() < k || s > heap.front().score; }
  void push(Hit h) {
    if ((int)heap.size() < k) { heap.push_back(h); std::push_heap(heap.begin(), heap.end(), Worse{}); return; }
    std::pop_heap(heap.begin(), heap.end(), Worse{});
    heap.back() = h;
    std::push_heap(heap.begin(), heap.end(), Worse{});
  }
  std::vector<Hit> sorted() { std::sort_heap(heap.begin(), heap.end(), Worse{}); return heap; }
};

// A base row's score is taken inline by each caller and checked against the heap first: most rows of
// an exact scan cannot enter it, and then nothing else is read.
inline void State::score_base_row(int64_t row, float dot_q, float qinv, TopK& top) const {
  const float s = dot_q * qinv * base_->inv_norms[row];
  if (!top.admits(s)) return;
  const Record* r = base_->rows[row];
  if (base_dead_ && ids_.get(static_cast<uint64_t>(r->id)) != r) return;  // superseded or deleted
  top.push({s, r->id});
}

void State::scan_base_dots(const float* dots, float qinv, int64_t speaker, TopK& top) const {
  // Locals the compiler can keep in registers (through the pointers it would reload every row), and
  // the heap's entry bar as a float: most rows of an exact scan fall below it and cost a compare.
  const Base& base = *base_;
  const float* inv = base.inv_norms.data();
  const auto* speakers = base.speakers.data();
  const int64_t n = base.n;
  float bar = -std::numeric_limits<float>::infinity();
  for (int64_t row = 0; row < n; ++row) {
    const float s = dots[row] * qinv * inv[row];
    if (!(s > bar) && (int)top.heap.size() == top.k) continue;
    if (speaker >= 0 && speakers[row] != speaker) continue;
    score_base_row(row, dots[row], qinv, top);
    if ((int)top.heap.size() == top.k) bar = top.heap.front().score;
  }
}

void State::scan_delta(const float* q, float qinv, int64_t speaker, TopK& top) const {
  // Delta records and their vectors are separate heap blocks: prefetch a leaf's 32 records, then their
  // vectors' first lines, so the misses overlap instead of stalling the scan one by one.
  delta_.for_each_leaf([&](void* const* slot) {
    for (int i = 0; i < 32; ++i)
      if (slot[i]) __builtin_prefetch(slot[i]);
    for (int i = 0; i < 32; ++i)
      if (slot[i]) {
        const float* v = static_cast<const Record*>(slot[i])->vec;
        __builtin_prefetch(v);
        __builtin_prefetch(v + 16);
      }
    for (int i = 0; i < 32; ++i) {
      const Record* r = static_cast<const Record*>(slot[i]);
      if (!r || (speaker >= 0 && r->speaker != speaker)) continue;
      float s = dot(q, r->vec, dim_) * qinv * r->inv_norm;
      if (top.admits(s) && ids_.get(static_cast<uint64_t>(r->id)) == r) top.push({s, r->id});
    }
  });
}

std::vector<Hit> State::search(const float* q, int k, int64_t speaker, const std::vector<int64_t>* base_rows) const {
  float qinv;
  validate_vector(q, dim_, &qinv);
  TopK top(clamp_k(k));
  if (top.k == 0) return {};
  auto consider = [&](int64_t row) {
    if (speaker < 0 || base_->speakers[row] == speaker)
      score_base_row(row, dot(q, base_->vectors + row * dim_, dim_), qinv, top);
  };
  if (base_) {
    if (base_rows) {
      for (int64_t row : *base_rows)
        if (row >= 0 && row < base_->n) consider(row);
    } else {
      for (int64_t row = 0; row < base_->n; ++row) consider(row);
    }
  }
  scan_delta(q, qinv, speaker, top);
  return top.sorted();
}

std::vector<std::vector<Hit>> State::search_many(const std::vector<const State*>& states, const float* queries,
                                                 int k, int64_t speaker, const float* base_dots) {
  const size_t n = states.size();
  if (n == 0) return {};
  const int dim = states[0]->dim_;
  for (const State* s : states)
    if (s->base_ != states[0]->base_ || s->dim_ != dim) throw BadInput("search_many: the states have different bases");
  std::vector<float> qinv(n);
  std::vector<TopK> tops;
  tops.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    validate_vector(queries + i * dim, dim, &qinv[i]);
    tops.emplace_back(states[i]->clamp_k(k));
  }
  const Base* base = states[0]->base_.get();
  if (base && base->n && !base_dots) throw BadInput("search_many: an exact search over a base needs base_dots");
  for (size_t i = 0; base && i < n; ++i)
    if (tops[i].k) states[i]->scan_base_dots(base_dots + i * base->n, qinv[i], speaker, tops[i]);
  std::vector<std::vector<Hit>> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (tops[i].k == 0) continue;
    states[i]->scan_delta(queries + i * dim, qinv[i], speaker, tops[i]);
    out[i] = tops[i].sorted();
  }
  return out;
}

}  // namespace memr1
