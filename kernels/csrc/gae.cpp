// GAE on CPU: the torch operator memr1::gae_cpu, which memr1.kernels.gae runs for CPU tensors.
//
// One backward walk along each sequence, rows spread over torch's intra-op threads. The running
// advantage is kept in double and each output rounded once from it, as the scalar definition reads:
//   a masked-off step leaves the running advantage and the next value untouched and writes 0;
//   delta_t = r_t + gamma * V_next - V_t,  A_t = delta_t + gamma * lam * A_next,  R_t = A_t + V_t.
// A step-at-a-time loop is bound by the latency of that multiply-add chain, not by memory, so on CPUs
// with AVX-512 rows whose steps are contiguous go through a vectorised scan (below); other layouts and
// CPUs take the scalar loop. The scan adds the same double terms in another order, so its outputs
// may differ from the loop's in the last bits of a double, far below a float32 output's rounding.
// Registered with the operator library that grpo_advantage.cpp defines (a fragment of it).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>

// GCC 12's masked AVX-512 intrinsics read an undefined vector they never use (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

template <typename T, typename M>
struct Args {
  const T* r;
  const T* v;
  const M* m;
  const T* boot;
  T* adv;
  T* ret;
  int64_t steps, r0, r1, v0, v1, m0, m1, b0;
  double gamma, gamma_lam;
};

template <typename T, typename M>
void gae_rows_scalar(const Args<T, M>& a, int64_t lo, int64_t hi) {
  const int64_t steps = a.steps;
  for (int64_t i = lo; i < hi; ++i) {
    double next_v = static_cast<double>(a.boot[i * a.b0]);
    double running = 0.0;
    for (int64_t t = steps - 1; t >= 0; --t) {
      const double vt = static_cast<double>(a.v[i * a.v0 + t * a.v1]);
      const bool real = a.m[i * a.m0 + t * a.m1] != 0;
      const double step = static_cast<double>(a.r[i * a.r0 + t * a.r1]) + a.gamma * next_v - vt + a.gamma_lam * running;
      running = real ? step : running;
      next_v = real ? vt : next_v;
      a.adv[i * steps + t] = real ? static_cast<T>(running) : T(0);
      a.ret[i * steps + t] = real ? static_cast<T>(running + vt) : T(0);
    }
  }
}

// ---- the AVX-512 path: time vectorised within a row, eight steps a vector ----
//
// The recurrence A_t = d_t + c_t * A_{t+1} (c_t = gamma * lam on a real step, 1 on a masked one, whose
// d_t is 0) is affine, so eight steps compose in three shift-and-multiply-add rounds; only the
// carry A_in -> A_t0 stays serial, one multiply-add per eight steps instead of one per step. V_next of
// each lane (the value at the next real step) is a permute by a per-mask index table. Rows stay in
// their own layout: no transposes, every load and store contiguous.
#define MEMR1_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

// kNext[k][j]: the lowest real lane above j in mask k, or 8 (the carried V_next) when none is.
struct NextReal {
  alignas(64) uint8_t idx[256][8];
  NextReal() {
    for (int k = 0; k < 256; ++k)
      for (int j = 0; j < 8; ++j) {
        int l = j + 1;
        while (l < 8 && !((k >> l) & 1)) ++l;
        idx[k][j] = static_cast<uint8_t>(l);
      }
  }
};
const NextReal kNext;

template <typename T>
MEMR1_AVX512 inline __m512d load8(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_cvtps_pd(_mm256_loadu_ps(p));
  } else {
    return _mm512_loadu_pd(p);
  }
}

template <typename T>
MEMR1_AVX512 inline __m512d load8(const T* p, __mmask8 lanes) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_cvtps_pd(_mm256_maskz_loadu_ps(lanes, p));
  } else {
    return _mm512_maskz_loadu_pd(lanes, p);
  }
}

template <typename T>
MEMR1_AVX512 inline void store8(T* p, __m512d x, bool stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (stream) _mm256_stream_ps(p, _mm512_cvtpd_ps(x)); else _mm256_storeu_ps(p, _mm512_cvtpd_ps(x));
  } else {
    if (stream) _mm512_stream_pd(p, x); else _mm512_storeu_pd(p, x);
  }
}

template <typename T>
MEMR1_AVX512 inline void store8(T* p, __mmask8 lanes, __m512d x) {
  if constexpr (std::is_same_v<T, float>) {
    _mm256_mask_storeu_ps(p, lanes, _mm512_cvtpd_ps(x));
  } else {
    _mm512_mask_storeu_pd(p, lanes, x);
  }
}

// What stays the same for a whole call: the constants of the scan.
struct Consts {
  __m512d g, gl, one, carry_pow, pow1, pow2, pow4, pow8;
  __m512i up1, up2, up4, next, zero;
};

MEMR1_AVX512 inline __m512d lane0(__m512d x, __m512i zero) { return _mm512_permutexvar_pd(zero, x); }

// Eight steps [t0, t0 + 8) of one row, every lane in the row (FULL) or the row's last, partial chunk.
// nv and run (V_next and A_next, broadcast) carry to the chunk before. Lane 0 of the scanned (c, d)
// maps the carried advantage to the one before the chunk; broadcasting it from d rather than from A
// keeps the serial chain to one multiply-add per chunk.
template <bool FULL, typename T, typename M>
MEMR1_AVX512 inline void chunk8(const Consts& K, const T* rp, const T* vp, const M* mp, T* ap, T* qp, __mmask8 lanes,
                                __m512d& nv, __m512d& run, bool stream) {
  __mmask8 k;
  if constexpr (FULL) {
    const __m128i mb = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mp));
    k = static_cast<__mmask8>(_mm_test_epi8_mask(mb, mb));
  } else {
    const __m128i mb = _mm_maskz_loadu_epi8(lanes, mp);
    k = static_cast<__mmask8>(_mm_test_epi8_mask(mb, mb));
  }
  if (k == 0) {  // padding: nothing carried changes
    if constexpr (FULL) {
      store8(ap, _mm512_setzero_pd(), stream);
      store8(qp, _mm512_setzero_pd(), stream);
    } else {
      store8(ap, lanes, _mm512_setzero_pd());
      store8(qp, lanes, _mm512_setzero_pd());
    }
    return;
  }
  __m512d r, v;
  if constexpr (FULL) {
    r = load8(rp);
    v = load8(vp);
  } else {
    r = load8(rp, lanes);
    v = load8(vp, lanes);
  }
  __m512d A, adv, ret;
  if (FULL && k == 0xFF) {  // all real: V_next is the next lane's value, c is gamma * lam throughout
    const __m512d vnext = _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(nv), _mm512_castpd_si512(v), 1));
    __m512d d = _mm512_fmadd_pd(K.g, vnext, _mm512_sub_pd(r, v));
    d = _mm512_fmadd_pd(K.pow1, _mm512_maskz_permutexvar_pd(0x7F, K.up1, d), d);
    d = _mm512_fmadd_pd(K.pow2, _mm512_maskz_permutexvar_pd(0x3F, K.up2, d), d);
    d = _mm512_fmadd_pd(K.pow4, _mm512_maskz_permutexvar_pd(0x0F, K.up4, d), d);
    A = _mm512_fmadd_pd(K.carry_pow, run, d);
    run = _mm512_fmadd_pd(K.pow8, run, lane0(d, K.zero));
    nv = v;
    adv = A;
    ret = _mm512_add_pd(A, v);
  } else {
    const __m512i idx = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(kNext.idx[k])));
    __m512d d = _mm512_maskz_mov_pd(k, _mm512_fmadd_pd(K.g, _mm512_permutex2var_pd(v, idx, nv), _mm512_sub_pd(r, v)));
    __m512d c = _mm512_mask_blend_pd(k, K.one, K.gl);
    d = _mm512_fmadd_pd(c, _mm512_maskz_permutexvar_pd(0x7F, K.up1, d), d);
    c = _mm512_mul_pd(c, _mm512_mask_permutexvar_pd(K.one, 0x7F, K.up1, c));
    d = _mm512_fmadd_pd(c, _mm512_maskz_permutexvar_pd(0x3F, K.up2, d), d);
    c = _mm512_mul_pd(c, _mm512_mask_permutexvar_pd(K.one, 0x3F, K.up2, c));
    d = _mm512_fmadd_pd(c, _mm512_maskz_permutexvar_pd(0x0F, K.up4, d), d);
    c = _mm512_mul_pd(c, _mm512_mask_permutexvar_pd(K.one, 0x0F, K.up4, c));
    A = _mm512_fmadd_pd(c, run, d);
    run = _mm512_fmadd_pd(lane0(c, K.zero), run, lane0(d, K.zero));  // a masked lane 0 passes A through
    nv = _mm512_permutexvar_pd(_mm512_set1_epi64(__builtin_ctz(k)), v);
    adv = _mm512_maskz_mov_pd(k, A);
    ret = _mm512_maskz_add_pd(k, A, v);
  }
  if constexpr (FULL) {
    store8(ap, adv, stream);
    store8(qp, ret, stream);
  } else {
    store8(ap, lanes, adv);
    store8(qp, lanes, ret);
  }
}

// One past the row's last real step (0 when it has none): what follows is padding, zeroed in bulk.
template <typename M>
MEMR1_AVX512 int64_t real_end(const M* mp, int64_t steps) {
  const char* p = reinterpret_cast<const char*>(mp);
  int64_t end = steps;
  for (; end >= 64; end -= 64) {
    const __m512i x = _mm512_loadu_si512(p + end - 64);
    const uint64_t k = _mm512_test_epi8_mask(x, x);
    if (k) return end - __builtin_clzll(k);
  }
  if (end > 0) {
    const __m512i x = _mm512_maskz_loadu_epi8((uint64_t(1) << end) - 1, p);
    const uint64_t k = _mm512_test_epi8_mask(x, x);
    if (k) return 64 - __builtin_clzll(k);
  }
  return 0;
}

template <typename T>
MEMR1_AVX512 void zero_fill(T* p, int64_t n, bool stream) {
  if (stream) {  // n is a multiple of 8 and p aligned (see `stream` below)
    for (int64_t t = 0; t < n; t += 8) store8(p + t, _mm512_setzero_pd(), true);
  } else if (n > 0) {
    std::memset(p, 0, n * sizeof(T));
  }
}

// stream: write the outputs with non-temporal stores, for outputs too large to stay in cache anyway;
// it saves reading every output line in before it is overwritten.
template <typename T, typename M>
MEMR1_AVX512 void gae_rows_avx512(const Args<T, M>& a, int64_t lo, int64_t hi, bool stream) {
  Consts K;
  const double p1 = a.gamma_lam, p2 = p1 * p1, p4 = p2 * p2;
  alignas(64) double pw[8];  // gl^(8 - j): how much of the carried advantage reaches lane j
  for (int j = 7; j >= 0; --j) pw[j] = (j == 7 ? p1 : pw[j + 1] * p1);
  K.g = _mm512_set1_pd(a.gamma);
  K.gl = _mm512_set1_pd(p1);
  K.one = _mm512_set1_pd(1.0);
  K.carry_pow = _mm512_load_pd(pw);
  K.pow1 = _mm512_set1_pd(p1);
  K.pow2 = _mm512_set1_pd(p2);
  K.pow4 = _mm512_set1_pd(p4);
  K.pow8 = _mm512_set1_pd(pw[0]);
  K.up1 = _mm512_setr_epi64(1, 2, 3, 4, 5, 6, 7, 0);
  K.up2 = _mm512_setr_epi64(2, 3, 4, 5, 6, 7, 0, 0);
  K.up4 = _mm512_setr_epi64(4, 5, 6, 7, 0, 0, 0, 0);
  K.next = _mm512_setr_epi64(1, 2, 3, 4, 5, 6, 7, 8);
  K.zero = _mm512_setzero_si512();
  const int64_t steps = a.steps, tail = steps & 7, full_end = steps - tail;
  for (int64_t i = lo; i < hi; ++i) {
    const T* rp = a.r + i * a.r0;
    const T* vp = a.v + i * a.v0;
    const M* mp = a.m + i * a.m0;
    T* ap = a.adv + i * steps;
    T* qp = a.ret + i * steps;
    __m512d nv = _mm512_set1_pd(static_cast<double>(a.boot[i * a.b0]));  // V_next, broadcast
    __m512d run = _mm512_setzero_pd();                                     // A_next, broadcast
    // Chunks start at multiples of 8; the first one holding the last real step is where the walk starts.
    const int64_t end = real_end(mp, steps), start = std::min((end + 7) & ~int64_t(7), steps);
    zero_fill(ap + start, steps - start, stream);
    zero_fill(qp + start, steps - start, stream);
    int64_t t0 = start - 8;
    if (start > full_end) {  // the row's last, partial chunk holds a real step
      const __mmask8 lanes = static_cast<__mmask8>((1u << tail) - 1);
      chunk8<false>(K, rp + full_end, vp + full_end, mp + full_end, ap + full_end, qp + full_end, lanes, nv, run,
                    false);
      t0 = full_end - 8;
    }
    for (; t0 >= 0; t0 -= 8) chunk8<true>(K, rp + t0, vp + t0, mp + t0, ap + t0, qp + t0, 0xFF, nv, run, stream);
  }
  if (stream) _mm_sfence();
}

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}
const bool kHasAvx512 = cpu_has_avx512();

// Outputs from this size on are streamed: beyond a core's L2 and a large share of its L3 slice, so
// their reader finds them in memory either way. (A fixed size: VMs report the host's L3.)
constexpr int64_t kStreamBytes = int64_t(8) << 20;
std::atomic<bool> use_simd{kHasAvx512};  // the tests switch it off to check the scalar loop too

template <typename T, typename M>
void gae_rows(const at::Tensor& r, const at::Tensor& v, const at::Tensor& m, const at::Tensor& boot, double gamma,
              double gamma_lam, at::Tensor& adv, at::Tensor& ret) {
  const Args<T, M> a{r.const_data_ptr<T>(), v.const_data_ptr<T>(), m.const_data_ptr<M>(), boot.const_data_ptr<T>(),
                     adv.mutable_data_ptr<T>(), ret.mutable_data_ptr<T>(), r.size(1), r.stride(0), r.stride(1),
                     v.stride(0), v.stride(1), m.stride(0), m.stride(1), boot.stride(0), gamma, gamma_lam};
  const bool simd = use_simd.load(std::memory_order_relaxed) && (a.r1 == 1 || a.steps == 1) &&
                    (a.v1 == 1 || a.steps == 1) && (a.m1 == 1 || a.steps == 1);
  // Grain: rows of a few thousand steps each are worth a thread; short rows are batched.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(a.steps, 1));
  // Non-temporal stores pay off once the outputs could not stay in cache for their reader anyway;
  // they need whole aligned vectors, which rows of a multiple of 8 steps give.
  const bool stream = simd && a.steps % 8 == 0 && 2 * r.numel() * int64_t(sizeof(T)) >= kStreamBytes &&
                      reinterpret_cast<uintptr_t>(a.adv) % 64 == 0 && reinterpret_cast<uintptr_t>(a.ret) % 64 == 0;
  at::parallel_for(0, r.size(0), grain, [&](int64_t lo, int64_t hi) {
    if (simd) {
      gae_rows_avx512(a, lo, hi, stream);
    } else {
      gae_rows_scalar(a, lo, hi);
    }
  });
}

void check_args(const at::Tensor& r, const at::Tensor& v, const at::Tensor& m, const at::Tensor& boot) {
  TORCH_CHECK(r.dim() == 2 && v.dim() == 2 && m.dim() == 2, "rewards, values and mask must be 2-D");
  TORCH_CHECK(boot.dim() == 1, "bootstrap must be 1-D, got ", boot.dim(), " dims");
  TORCH_CHECK(r.scalar_type() == at::kFloat || r.scalar_type() == at::kDouble,
              "rewards must be float32 or float64, got ", r.scalar_type());
  TORCH_CHECK(v.scalar_type() == r.scalar_type() && boot.scalar_type() == r.scalar_type(),
              "values and bootstrap must have the rewards' dtype ", r.scalar_type());
  TORCH_CHECK(m.scalar_type() == at::kBool || m.scalar_type() == at::kByte, "mask must be bool or uint8, got ",
              m.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> gae_cpu(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask,
                                           const at::Tensor& bootstrap, double gamma, double gamma_lam) {
  check_args(rewards, values, mask, bootstrap);
  TORCH_CHECK(values.sizes() == rewards.sizes() && mask.sizes() == rewards.sizes(),
              "values and mask must have the rewards' shape ", rewards.sizes());
  TORCH_CHECK(bootstrap.size(0) == rewards.size(0), "bootstrap must hold one value per row: ", bootstrap.size(0),
              " for ", rewards.size(0), " rows");
  at::Tensor adv = at::empty(rewards.sizes(), rewards.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor ret = at::empty_like(adv);
  AT_DISPATCH_FLOATING_TYPES(rewards.scalar_type(), "gae_cpu", [&] {
    if (mask.scalar_type() == at::kBool) {
      gae_rows<scalar_t, bool>(rewards, values, mask, bootstrap, gamma, gamma_lam, adv, ret);
    } else {
      gae_rows<scalar_t, uint8_t>(rewards, values, mask, bootstrap, gamma, gamma_lam, adv, ret);
    }
  });
  return {adv, ret};
}

std::tuple<at::Tensor, at::Tensor> gae_meta(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask,
                                            const at::Tensor& bootstrap, double, double) {
  check_args(rewards, values, mask, bootstrap);
  at::Tensor adv = at::empty_like(rewards, at::MemoryFormat::Contiguous);
  return {adv, at::empty_like(adv)};
}

// mode -1 asks, 0 selects the scalar loop, 1 the AVX-512 path where the CPU has it; returns the
// path then in use (1: AVX-512). For the tests, which check both paths on one machine.
int64_t gae_cpu_simd(int64_t mode) {
  if (mode >= 0) use_simd.store(mode != 0 && kHasAvx512);
  return use_simd.load() ? 1 : 0;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memr1, m) {
  m.def("gae_cpu(Tensor rewards, Tensor values, Tensor mask, Tensor bootstrap, float gamma, float gamma_lam) "
        "-> (Tensor, Tensor)");
  m.def("gae_cpu_simd(int mode) -> int", &gae_cpu_simd);
}
TORCH_LIBRARY_IMPL(memr1, CPU, m) { m.impl("gae_cpu", &gae_cpu); }
TORCH_LIBRARY_IMPL(memr1, Meta, m) { m.impl("gae_cpu", &gae_meta); }
