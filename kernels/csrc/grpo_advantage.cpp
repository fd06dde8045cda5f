// Group-normalised advantages on CPU: the torch operator memr1::grpo_advantage_cpu, which
// memr1.kernels.grpo_advantage runs for CPU tensors.
//
// Two passes over the batch instead of the torch reference's twenty small ops. Pass 1 takes, per
// group, a pivot (the first member in row order), the count, and the sums of d = r - pivot and d*d,
// all in double. Pass 2 writes (r - centre) * factor. One pass of sums loses nothing here because the
// pivot is a member: sum(d*d) = SS + n*mean_d^2 and mean_d^2 <= SS, so sum(d*d) <= (n + 1) * SS and
// the cancellation costs at most about n ulps of SS. An all-equal group has every d == 0, so its
// centre is its pivot and each advantage is exactly 0. Rows whose id is outside [0, G) take part in
// no group and get NaN.
//
// A registered operator (not a pybind11 function) so that the dispatcher calls it without Python in
// between and torch.compile keeps it inside a caller's graph (the Meta kernel gives its shape).
#include <ATen/ATen.h>
#include <Python.h>
#include <sys/mman.h>
#include <unistd.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

namespace {

enum Std { kUnbiased = 0, kPopulation = 1, kNone = 2 };

// Pass 1's record. The pivot is a member's reward, so it is stored in the rewards' own type: a
// float32 batch gets a 24-byte record instead of 32, which is a quarter less of the random-access
// table that decides the time once the table outgrows L2. Finalize turns (sum, sum_sq) into
// (centre, factor), the only two fields pass 2 reads.
template <typename T>
struct Group {
  T pivot;
  uint32_t n;     // a row count: the operator checks that the batch has under 2^32 rows
  double sum;     // of d = r - pivot; then: the centre, pivot + mean_d
  double sum_sq;  // of d * d; then: the factor a centred reward is multiplied by
};

// 1/k for the group sizes a batch really has, so that finalize pays one division (the factor's)
// instead of three; larger groups divide. A product with a rounded reciprocal is within an ulp of
// the quotient, far below the float64 sums' own error.
constexpr int kSmallGroup = 256;
struct Reciprocals {
  double v[kSmallGroup + 1];
  Reciprocals() {
    v[0] = 0.0;
    for (int k = 1; k <= kSmallGroup; ++k) v[k] = 1.0 / k;
  }
};
const Reciprocals kReciprocal;

double reciprocal(uint32_t k) { return k <= kSmallGroup ? kReciprocal.v[k] : 1.0 / k; }

// What a centred reward is multiplied by: the LOO scale over (std + eps), as the torch reference.
double group_factor(uint32_t n, double ss, int64_t std_kind, bool loo, double eps) {
  double factor = loo ? (n > 1 ? n * reciprocal(n - 1) : 0.0) : 1.0;
  if (std_kind == kNone) return factor;
  const uint32_t dof = std_kind == kUnbiased ? std::max(n - 1, 1u) : std::max(n, 1u);
  const double den = std::sqrt(ss * reciprocal(dof)) + eps;
  return den > 0.0 ? factor / den : 0.0;
}

// The group table, 2 MiB-aligned with transparent huge pages requested: past L2's size every row's
// lookup is a random access, and 4 KiB pages add a TLB miss to most of them.
template <typename Record>
struct GroupTable {
  Record* data = nullptr;
  explicit GroupTable(size_t n) {
    constexpr size_t kHuge = size_t(2) << 20;
    const size_t bytes = std::max(n, size_t(1)) * sizeof(Record);
    const size_t align = bytes >= kHuge ? kHuge : alignof(Record);
    const size_t rounded = (bytes + align - 1) / align * align;  // aligned_alloc wants a multiple
    data = static_cast<Record*>(std::aligned_alloc(align, rounded));
    if (!data) throw std::bad_alloc();
    if (align == kHuge) madvise(data, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
    std::memset(static_cast<void*>(data), 0, n * sizeof(Record));
  }
  ~GroupTable() { std::free(data); }
  GroupTable(const GroupTable&) = delete;
  GroupTable& operator=(const GroupTable&) = delete;
};

// This core's L2 in bytes (1 MiB where the C library cannot say). A table that fits is served from
// L2, where software prefetches only add instructions; past it they overlap the misses.
size_t l2_bytes() {
  static const size_t bytes = [] {
    const long b = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return b > 0 ? static_cast<size_t>(b) : size_t(1) << 20;
  }();
  return bytes;
}

// Rows ahead that a prefetching pass asks for: enough to cover a miss to L3 or DRAM at a few
// nanoseconds a row.
constexpr int64_t kAhead = 16;

// Asks for row i + kAhead's group record, for writing (pass 1) or reading (pass 2).
template <int kWrite, typename Record>
inline void prefetch_ahead(const int64_t* gid, int64_t i, int64_t n_rows, uint64_t num_groups, const Record* groups) {
  if (i + kAhead >= n_rows) return;
  const uint64_t ahead = static_cast<uint64_t>(gid[i + kAhead]);
  if (ahead < num_groups) __builtin_prefetch(groups + ahead, kWrite);
}

template <bool kPrefetch, typename T>
void accumulate(const T* r, const int64_t* gid, int64_t n_rows, uint64_t num_groups, Group<T>* groups) {
  for (int64_t i = 0; i < n_rows; ++i) {
    if (kPrefetch) prefetch_ahead</*kWrite=*/1>(gid, i, n_rows, num_groups, groups);
    const uint64_t g = static_cast<uint64_t>(gid[i]);  // a negative id wraps past num_groups
    if (g >= num_groups) continue;
    Group<T>& s = groups[g];
    s.pivot = s.n == 0 ? r[i] : s.pivot;
    const double d = static_cast<double>(r[i]) - static_cast<double>(s.pivot);
    s.n += 1;
    s.sum += d;
    s.sum_sq += d * d;
  }
}

template <bool kPrefetch, typename T>
void normalise(const T* r, const int64_t* gid, int64_t n_rows, uint64_t num_groups, const Group<T>* groups,
               T* out) {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (int64_t i = 0; i < n_rows; ++i) {
    if (kPrefetch) prefetch_ahead</*kWrite=*/0>(gid, i, n_rows, num_groups, groups);
    const uint64_t g = static_cast<uint64_t>(gid[i]);
    out[i] = g < num_groups ? static_cast<T>((static_cast<double>(r[i]) - groups[g].sum) * groups[g].sum_sq) : nan;
  }
}

// One thread: a real batch (256 to 8k rows) takes microseconds, and splitting the groups over threads
// (each thread scanning every row) was slower than one thread even at 1M rows on 2 cores.
template <typename T>
void advantages(const T* r, const int64_t* gid, int64_t n_rows, uint64_t num_groups, int64_t std_kind,
                bool loo, double eps, T* out) {
  GroupTable<Group<T>> table(num_groups);
  Group<T>* groups = table.data;
  const bool prefetch = num_groups * sizeof(Group<T>) > l2_bytes();
  if (prefetch) {
    accumulate<true>(r, gid, n_rows, num_groups, groups);
  } else {
    accumulate<false>(r, gid, n_rows, num_groups, groups);
  }
  for (uint64_t g = 0; g < num_groups; ++g) {
    Group<T>& s = groups[g];
    if (s.n == 0) continue;
    const double mean_d = s.sum * reciprocal(s.n);
    const double ss = std::max(s.sum_sq - s.sum * mean_d, 0.0);
    s.sum = static_cast<double>(s.pivot) + mean_d;
    s.sum_sq = group_factor(s.n, ss, std_kind, loo, eps);
  }
  if (prefetch) {
    normalise<true>(r, gid, n_rows, num_groups, groups, out);
  } else {
    normalise<false>(r, gid, n_rows, num_groups, groups, out);
  }
}

// Ranks, dtypes and std_kind; no sizes or num_groups, which under torch.compile are symbols that
// reading as integers would pin to one value (a recompile for every batch size).
void check_args(const at::Tensor& rewards, const at::Tensor& group_ids, int64_t std_kind) {
  TORCH_CHECK(rewards.dim() == 1, "rewards must be 1-D, got ", rewards.dim(), " dims");
  TORCH_CHECK(rewards.scalar_type() == at::kFloat || rewards.scalar_type() == at::kDouble,
              "rewards must be float32 or float64, got ", rewards.scalar_type());
  TORCH_CHECK(group_ids.dim() == 1, "group_ids must be 1-D, got ", group_ids.dim(), " dims");
  TORCH_CHECK(at::isIntegralType(group_ids.scalar_type(), /*includeBool=*/false),
              "group_ids must be an integer tensor, got ", group_ids.scalar_type());
  TORCH_CHECK(std_kind >= kUnbiased && std_kind <= kNone, "std_kind must be 0, 1 or 2, got ", std_kind);
}

at::Tensor grpo_advantage_cpu(const at::Tensor& rewards, const at::Tensor& group_ids, int64_t num_groups,
                              int64_t std_kind, bool loo, double eps) {
  check_args(rewards, group_ids, std_kind);
  TORCH_CHECK(num_groups >= 0, "num_groups must be >= 0, got ", num_groups);
  TORCH_CHECK(group_ids.size(0) == rewards.size(0), "group_ids must hold one id per reward: ",
              group_ids.size(0), " ids for ", rewards.size(0), " rewards");
  TORCH_CHECK(rewards.size(0) <= int64_t(std::numeric_limits<uint32_t>::max()),
              "grpo_advantage_cpu counts group members in 32 bits; got ", rewards.size(0), " rewards");
  const at::Tensor r = rewards.contiguous();
  const at::Tensor gid = group_ids.to(at::kLong).contiguous();
  at::Tensor out = at::empty_like(r, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES(r.scalar_type(), "grpo_advantage_cpu", [&] {
    advantages<scalar_t>(r.const_data_ptr<scalar_t>(), gid.const_data_ptr<int64_t>(), r.size(0),
                         static_cast<uint64_t>(num_groups), std_kind, loo, eps, out.mutable_data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor grpo_advantage_meta(const at::Tensor& rewards, const at::Tensor& group_ids, c10::SymInt num_groups,
                               int64_t std_kind, bool, double) {
  check_args(rewards, group_ids, std_kind);
  TORCH_SYM_CHECK(num_groups.sym_ge(0), "num_groups must be >= 0");
  TORCH_SYM_CHECK(group_ids.sym_size(0).sym_eq(rewards.sym_size(0)), "group_ids must hold one id per reward");
  return at::empty_like(rewards, at::MemoryFormat::Contiguous);
}

}  // namespace

TORCH_LIBRARY(memr1, m) {
  m.def("grpo_advantage_cpu(Tensor rewards, Tensor group_ids, SymInt num_groups, int std_kind, bool loo, "
        "float eps) -> Tensor");
}
TORCH_LIBRARY_IMPL(memr1, CPU, m) { m.impl("grpo_advantage_cpu", &grpo_advantage_cpu); }
TORCH_LIBRARY_IMPL(memr1, Meta, m) { m.impl("grpo_advantage_cpu", &grpo_advantage_meta); }

// An importable module with nothing in it: `import memr1.kernels._native` loads this library, whose
// static initialisers above register the operator (torch must be imported first).
static PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_native", "memr1's native CPU kernels (torch operators)",
                              -1, nullptr, nullptr, nullptr, nullptr, nullptr};
PyMODINIT_FUNC PyInit__native() { return PyModule_Create(&kModule); }
