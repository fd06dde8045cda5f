// Exact search of a bank state: a dot product picked for this CPU at load time, a top-k heap, and
// State::search over the base rows (all of them, or HNSW candidates) and the delta. See core.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core.h"
#include "cosine_i8.h"

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

struct I8Scratch {  // search_many's buffers: every query's codes and i8 scores, one query's bounds
  std::vector<int8_t> code;
  std::vector<uint8_t> shifted;        // [queries, dim]: code + 128, as the VNNI kernel takes it
  std::vector<float> scale, err, norm; // per query: u ~ scale * code, |u - scale * code|, |scale * code|
  std::vector<int32_t> dots;           // [queries, base rows]
  std::vector<float> lows, highs, heap; // one query's bounds per row; the largest lower bounds
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

namespace {
// A unit vector u (v times its inverse norm) as i8 codes c with u ~ scale * c; returns |u - scale * c|.
float quantize(const float* v, float inv_norm, int dim, int8_t* c, float* scale_out) {
  float m[8] = {0};  // independent partial results, so that both loops vectorise
  int j = 0;
  for (; j + 8 <= dim; j += 8)
    for (int t = 0; t < 8; ++t) m[t] = std::max(m[t], std::fabs(v[j + t] * inv_norm));
  for (; j < dim; ++j) m[0] = std::max(m[0], std::fabs(v[j] * inv_norm));
  const float top = *std::max_element(m, m + 8);
  const float scale = top > 0.f ? top / 127.f : 1.f, inv_scale = 1.f / scale;  // locals: c (i8) may alias them
  double e[8] = {0};
  auto one = [&](int j) {
    const float u = v[j] * inv_norm, x = u * inv_scale;
    // Rounded half away from zero without a libm call (|x| <= 127 by the choice of scale, up to rounding).
    const int code = std::clamp(static_cast<int>(x + (x < 0.f ? -0.5f : 0.5f)), -127, 127);
    c[j] = static_cast<int8_t>(code);
    const double d = double(u) - double(scale) * code;
    return d * d;
  };
  for (j = 0; j + 8 <= dim; j += 8)
    for (int t = 0; t < 8; ++t) e[t] += one(j + t);
  for (; j < dim; ++j) e[0] += one(j);
  *scale_out = scale;
  return static_cast<float>(std::sqrt(((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]))));
}
// What the bound leaves to float rounding: of the float32 scores (a sum over dim products, each < 1)
// and of the i8 scores' scale products. Far below the quantisation error it is added to.
constexpr float kSlack = 1e-4f;
}  // namespace

const BaseCodes& Base::i8(int dim) const {
  std::call_once(i8_once_, [&] {
    i8_.codes.resize(static_cast<size_t>(n) * dim);
    i8_.sums.resize(static_cast<size_t>(n));
    i8_.scale.resize(static_cast<size_t>(n));
    i8_.err.resize(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      int8_t* c = i8_.codes.data() + r * dim;
      i8_.err[r] = quantize(vectors + r * dim, inv_norms[r], dim, c, &i8_.scale[r]);
      int32_t sum = 0;
      for (int j = 0; j < dim; ++j) sum += c[j];
      i8_.sums[r] = sum;
    }
  });
  return i8_;
}

void State::scan_base_i8(const float* q, float qinv, size_t i, int64_t speaker, TopK& top, I8Scratch& w) const {
  // Row r's float32 score s and its i8 estimate e differ by at most
  //   |q - q~| |u| + |q~| |u - u~|  =  err(q) + |q~| err(r)   (|u| = 1; q~, u~ the dequantised codes),
  // so a row whose e + bound is below the k-th largest e - bound of the rows can never enter the top k.
  // Up to base_dead_ of those rows may be dead in this state, so the bar is the (k + base_dead_)-th.
  const Base& base = *base_;
  const BaseCodes& bc = base.i8(dim_);
  const int64_t n = base.n;
  w.lows.resize(static_cast<size_t>(n));
  w.highs.resize(static_cast<size_t>(n));
  {  // every row's bounds, in a loop the compiler vectorises
    const int32_t* __restrict dots = w.dots.data() + i * static_cast<size_t>(n);
    const float *__restrict scale = bc.scale.data(), *__restrict err = bc.err.data();
    float *__restrict low = w.lows.data(), *__restrict high = w.highs.data();
    const float q_scale = w.scale[i], q_err = w.err[i] + kSlack, q_norm = w.norm[i];
    for (int64_t r = 0; r < n; ++r) {
      const float est = q_scale * scale[r] * static_cast<float>(dots[r]), rad = q_err + q_norm * err[r];
      low[r] = est - rad;
      high[r] = est + rad;
    }
  }
  const float *low = w.lows.data(), *high = w.highs.data();
  const auto* speakers = base.speakers.data();
  const bool all = speaker < 0;
  const size_t want = static_cast<size_t>(top.k) + static_cast<size_t>(base_dead_);
  std::vector<float>& heap = w.heap;  // a min-heap of the `want` largest lower bounds
  heap.clear();
  float bar = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < n; ++r) {
    if (low[r] <= bar || !(all || speakers[r] == speaker)) continue;
    if (heap.size() == want) std::pop_heap(heap.begin(), heap.end(), std::greater<float>()), heap.pop_back();
    heap.push_back(low[r]);
    std::push_heap(heap.begin(), heap.end(), std::greater<float>());
    if (heap.size() == want) bar = heap.front();
  }
  for (int64_t r = 0; r < n; ++r)
    if (high[r] >= bar && (all || speakers[r] == speaker))
      score_base_row(r, dot(q, base.vectors + r * dim_, dim_), qinv, top);
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
                                                 int k, int64_t speaker) {
  const size_t m = states.size();
  if (m == 0) return {};
  const int dim = states[0]->dim_;
  for (const State* s : states)
    if (s->base_ != states[0]->base_ || s->dim_ != dim) throw BadInput("search_many: the states have different bases");
  std::vector<float> qinv(m);
  for (size_t i = 0; i < m; ++i) validate_vector(queries + i * dim, dim, &qinv[i]);
  const Base* base = states[0]->base_.get();
  I8Scratch w;
  if (base && base->n) {  // every query's i8 scores against the base, in one pass over it
    const BaseCodes& bc = base->i8(dim);
    w.code.resize(static_cast<size_t>(dim));
    w.shifted.resize(m * dim);
    w.scale.resize(m), w.err.resize(m), w.norm.resize(m);
    QueryI8 q8;  // the walk's query form: code + 128 for the VNNI kernel, and |code|
    for (size_t i = 0; i < m; ++i) {
      w.err[i] = quantize(queries + i * dim, qinv[i], dim, w.code.data(), &w.scale[i]);
      q8.set(w.code.data(), static_cast<size_t>(dim));
      std::copy(q8.shifted.begin(), q8.shifted.end(), w.shifted.begin() + i * dim);
      w.norm[i] = w.scale[i] * q8.norm;
    }
    w.dots.resize(m * static_cast<size_t>(base->n));
    dots_i8_many(w.shifted.data(), m, bc.codes.data(), bc.sums.data(), base->n, static_cast<size_t>(dim),
                 static_cast<size_t>(dim), w.dots.data());
  }
  std::vector<std::vector<Hit>> out(m);
  for (size_t i = 0; i < m; ++i) {
    const State& s = *states[i];
    TopK top(s.clamp_k(k));
    if (top.k == 0) continue;
    if (base && base->n) s.scan_base_i8(queries + i * dim, qinv[i], i, speaker, top, w);
    s.scan_delta(queries + i * dim, qinv[i], speaker, top);
    out[i] = top.sorted();
  }
  return out;
}

}  // namespace memr1
