// GAE on CPU: the torch operator memr1::gae_cpu, which memr1.kernels.gae runs for CPU tensors.
//
// One backward walk along each sequence, rows spread over torch's intra-op threads. The loop over
// time is serial by nature; a torch program pays an operator dispatch per step for it (thousands of
// steps), while here a step is a few instructions on a row that streams through cache. The running
// advantage is kept in double and rounded once per output, as the scalar definition reads:
//   a masked-off step leaves the running advantage and the next value untouched and writes 0;
//   delta_t = r_t + gamma * V_next - V_t,  A_t = delta_t + gamma * lam * A_next,  R_t = A_t + V_t.
// Registered with the operator library that grpo_advantage.cpp defines (a fragment of it).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

namespace {

template <typename T, typename M>
void gae_rows(const at::Tensor& r, const at::Tensor& v, const at::Tensor& m, const at::Tensor& boot, double gamma,
              double gamma_lam, at::Tensor& adv, at::Tensor& ret) {
  const int64_t n = r.size(0), steps = r.size(1);
  const T* rp = r.const_data_ptr<T>();
  const T* vp = v.const_data_ptr<T>();
  const M* mp = m.const_data_ptr<M>();
  const T* bp = boot.const_data_ptr<T>();
  T* ap = adv.mutable_data_ptr<T>();
  T* qp = ret.mutable_data_ptr<T>();
  const int64_t r0 = r.stride(0), r1 = r.stride(1), v0 = v.stride(0), v1 = v.stride(1);
  const int64_t m0 = m.stride(0), m1 = m.stride(1), b0 = boot.stride(0);
  // Grain: rows of a few thousand steps each are worth a thread; short rows are batched.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(steps, 1));
  at::parallel_for(0, n, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      double next_v = static_cast<double>(bp[i * b0]);
      double running = 0.0;
      for (int64_t t = steps - 1; t >= 0; --t) {
        const double vt = static_cast<double>(vp[i * v0 + t * v1]);
        const bool real = mp[i * m0 + t * m1] != 0;
        const double step = static_cast<double>(rp[i * r0 + t * r1]) + gamma * next_v - vt + gamma_lam * running;
        running = real ? step : running;
        next_v = real ? vt : next_v;
        ap[i * steps + t] = real ? static_cast<T>(running) : T(0);
        qp[i * steps + t] = real ? static_cast<T>(running + vt) : T(0);
      }
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(memr1, m) {
  m.def("gae_cpu(Tensor rewards, Tensor values, Tensor mask, Tensor bootstrap, float gamma, float gamma_lam) "
        "-> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(memr1, CPU, m) { m.impl("gae_cpu", &gae_cpu); }
TORCH_LIBRARY_IMPL(memr1, Meta, m) { m.impl("gae_cpu", &gae_meta); }
