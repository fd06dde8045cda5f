// Graph (graph.h) over usearch's index_dense_t, the type usearch's Python package saves. The build
// compiles usearch's headers of the installed package's version without its optional SIMD library
// (NumKong, which the wheel loads at run time); its own distances are then built for baseline x86-64.
// For the bank's default graph (i8, cosine) the walk uses the same integer arithmetic with 16-bit
// multiply-adds (AVX-512 VNNI or AVX2), picked at load time. Candidates are re-scored exactly in f32
// by State::search.
#include "graph.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <condition_variable>
#include <mutex>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <usearch/index_dense.hpp>

#include "core.h"

namespace memr1 {

namespace us = unum::usearch;

struct Graph::Impl {
  us::index_dense_t index;
  size_t entry = 0;  // the entry point's slot, read from the file's header (usearch keeps it private)
  // usearch fails a search that finds no free per-thread context; this pool makes one wait instead.
  std::mutex mu;
  std::condition_variable freed;
  std::vector<size_t> contexts;

  size_t acquire() {
    std::unique_lock<std::mutex> lock(mu);
    freed.wait(lock, [&] { return !contexts.empty(); });
    size_t id = contexts.back();
    contexts.pop_back();
    return id;
  }
  void release(size_t id) {
    { std::lock_guard<std::mutex> lock(mu); contexts.push_back(id); }
    freed.notify_one();
  }
};

Graph::Graph() : impl_(new Impl) {}
Graph::~Graph() = default;

namespace {
// usearch's i8 cosine distance (metric_cos_i8_t): exact int32 sums, so every build gives the same value.
float cos_from_sums(int32_t ab, int32_t a2, int32_t b2) {
  if (a2 == 0 && b2 == 0) return 0.f;
  if (ab == 0) return 1.f;
  float d = 1.f - static_cast<float>(ab) / (std::sqrt(static_cast<float>(a2)) * std::sqrt(static_cast<float>(b2)));
  return d < 0.f ? 0.f : d;
}
// The three sums over a[i..dim) and b[i..dim), added to `s`: the whole scalar kernel, and the tail
// the vector kernels leave.
struct Sums {
  int32_t ab = 0, a2 = 0, b2 = 0;
};
inline void add_sums(const int8_t* a, const int8_t* b, size_t i, size_t dim, Sums& s) {
  for (; i < dim; ++i) {
    int32_t x = a[i], y = b[i];
    s.ab += x * y;
    s.a2 += x * x;
    s.b2 += y * y;
  }
}
using CosFn = float (*)(size_t, size_t, size_t);  // usearch's array-array-size signature (pointers as words)
float cos_i8_default(size_t a, size_t b, size_t dim) {
  Sums s;
  add_sums(reinterpret_cast<const int8_t*>(a), reinterpret_cast<const int8_t*>(b), 0, dim, s);
  return cos_from_sums(s.ab, s.a2, s.b2);
}
#if defined(__x86_64__)
// The same sums with 16-bit multiply-adds: sign-extend 16 or 32 bytes to 16-bit lanes, then each
// instruction multiplies lane pairs and adds them into 32-bit sums (the compiler's own vectorisation of
// the scalar loop widens to 32 bits and multiplies lane by lane, about four times the instructions).
// Every product and sum is an exact integer, so the distance equals the scalar kernel's bit for bit.
__attribute__((target("avx2"))) float cos_i8_avx2(size_t pa, size_t pb, size_t dim) {
  const int8_t* a = reinterpret_cast<const int8_t*>(pa);
  const int8_t* b = reinterpret_cast<const int8_t*>(pb);
  __m256i ab = _mm256_setzero_si256(), a2 = ab, b2 = ab;
  size_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256i y = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    ab = _mm256_add_epi32(ab, _mm256_madd_epi16(x, y));
    a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(x, x));
    b2 = _mm256_add_epi32(b2, _mm256_madd_epi16(y, y));
  }
  alignas(32) int32_t s[3][8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(s[0]), ab);
  _mm256_store_si256(reinterpret_cast<__m256i*>(s[1]), a2);
  _mm256_store_si256(reinterpret_cast<__m256i*>(s[2]), b2);
  Sums sums;
  for (int l = 0; l < 8; ++l) sums.ab += s[0][l], sums.a2 += s[1][l], sums.b2 += s[2][l];
  add_sums(a, b, i, dim, sums);
  return cos_from_sums(sums.ab, sums.a2, sums.b2);
}
__attribute__((target("avx512f,avx512bw,avx512vnni"))) float cos_i8_avx512(size_t pa, size_t pb, size_t dim) {
  const int8_t* a = reinterpret_cast<const int8_t*>(pa);
  const int8_t* b = reinterpret_cast<const int8_t*>(pb);
  __m512i ab = _mm512_setzero_si512(), a2 = ab, b2 = ab;
  size_t i = 0;
  for (; i + 32 <= dim; i += 32) {
    const __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i)));
    const __m512i y = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i)));
    ab = _mm512_dpwssd_epi32(ab, x, y);
    a2 = _mm512_dpwssd_epi32(a2, x, x);
    b2 = _mm512_dpwssd_epi32(b2, y, y);
  }
  Sums sums;
  sums.ab = _mm512_reduce_add_epi32(ab), sums.a2 = _mm512_reduce_add_epi32(a2), sums.b2 = _mm512_reduce_add_epi32(b2);
  add_sums(a, b, i, dim, sums);
  return cos_from_sums(sums.ab, sums.a2, sums.b2);
}
bool has_avx512_vnni() { return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"); }
#endif
CosFn pick_cos_i8() {
#if defined(__x86_64__)
  if (has_avx512_vnni()) return cos_i8_avx512;
  if (__builtin_cpu_supports("avx2")) return cos_i8_avx2;
#endif
  return cos_i8_default;
}
const CosFn cos_i8 = pick_cos_i8();

// usearch's results carry an error that throws from its destructor when left unread; read it here.
template <class R> void check(R& result, const std::string& what) {
  if (result) return;
  std::string msg = result.error.release();
  throw LogFormat(what + ": " + msg);
}
}  // namespace

// The entry slot of a serialized index_dense_t (`read(offset, out, n)` reads the file's bytes): the
// matrix header (u32 or u64 rows and bytes per row) and vectors, usearch's 64-byte head (its magic
// first), then the graph's header of five u64: size, connectivity, connectivity_base, max_level,
// entry_slot. Both widths are tried; the one whose magic sits where it should and whose graph size
// matches the rows wins.
template <class Read> size_t entry_slot(Read&& read, size_t file_size, const std::string& what) {
  for (size_t width : {size_t(4), size_t(8)}) {
    uint64_t rows = 0, cols = 0;
    if (!read(0, &rows, width) || !read(width, &cols, width)) break;
    const size_t head = 2 * width + rows * cols;
    if (cols == 0 || rows * cols / cols != rows || head + 64 + 40 > file_size) continue;
    char magic[7];
    uint64_t graph[5];
    if (!read(head, magic, sizeof(magic)) || std::memcmp(magic, "usearch", 7) != 0) continue;
    if (!read(head + 64, graph, sizeof(graph)) || graph[0] != rows) continue;
    if (rows && graph[4] >= rows) break;
    return static_cast<size_t>(graph[4]);
  }
  throw LogFormat(what + ": cannot find the graph's entry point in its header");
}

// The search beam, the i8 cosine above, and a search context per core: more concurrent searches than
// cores only queue for a free one.
void prepare(Graph::Impl& g, size_t beam, const std::string& what) {
  if (beam == 0) throw BadInput("a graph's search beam must be >= 1");
  g.index.change_expansion_search(beam);
  if (g.index.metric_kind() == us::metric_kind_t::cos_k && g.index.scalar_kind() == us::scalar_kind_t::i8_k)
    g.index.change_metric(us::metric_punned_t::stateless(g.index.dimensions(), reinterpret_cast<std::uintptr_t>(cos_i8),
                                                         us::metric_punned_signature_t::array_array_size_k,
                                                         us::metric_kind_t::cos_k, us::scalar_kind_t::i8_k));
  size_t threads = std::max<size_t>(std::thread::hardware_concurrency(), 1);
  if (!g.index.try_reserve(us::index_limits_t(g.index.size(), threads)))
    throw LogFormat(what + ": cannot reserve search contexts");
  for (size_t i = 0; i < threads; ++i) g.contexts.push_back(i);
}

std::shared_ptr<Graph> Graph::view(const std::string& path, size_t beam) {
  std::shared_ptr<Graph> g(new Graph);
  auto result = g->impl_->index.view(us::memory_mapped_file_t(path.c_str()));
  check(result, path + " is not a usearch index");
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw LogFormat(path + ": cannot open it again to read its header");
  std::fseek(file.get(), 0, SEEK_END);
  const size_t size = static_cast<size_t>(std::ftell(file.get()));
  g->impl_->entry = entry_slot([&](size_t at, void* out, size_t n) {
    return std::fseek(file.get(), static_cast<long>(at), SEEK_SET) == 0 && std::fread(out, 1, n, file.get()) == n;
  }, size, path);
  prepare(*g->impl_, beam, path);
  return g;
}

std::shared_ptr<Graph> Graph::load(const uint8_t* data, size_t n, size_t beam) {
  std::shared_ptr<Graph> g(new Graph);
  auto result = g->impl_->index.load(us::memory_mapped_file_t(const_cast<us::byte_t*>(
      reinterpret_cast<const us::byte_t*>(data)), n));  // load() only reads the buffer, then copies
  check(result, "a serialized usearch index");
  g->impl_->entry = entry_slot([&](size_t at, void* out, size_t k) {
    if (at + k > n) return false;
    std::memcpy(out, data + at, k);
    return true;
  }, n, "a serialized usearch index");
  prepare(*g->impl_, beam, "a serialized usearch index");
  return g;
}

std::vector<std::pair<std::string, float>> Graph::cos_i8_kernels(const int8_t* a, const int8_t* b, size_t dim) {
  const auto pa = reinterpret_cast<size_t>(a), pb = reinterpret_cast<size_t>(b);
  std::vector<std::pair<std::string, float>> out{{"scalar", cos_i8_default(pa, pb, dim)}};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) out.emplace_back("avx2", cos_i8_avx2(pa, pb, dim));
  if (has_avx512_vnni()) out.emplace_back("avx512_vnni", cos_i8_avx512(pa, pb, dim));
#endif
  return out;
}

size_t Graph::size() const { return impl_->index.size(); }
size_t Graph::dim() const { return impl_->index.dimensions(); }
size_t Graph::expansion() const { return impl_->index.expansion_search(); }

std::vector<uint64_t> Graph::unreachable() const {
  const us::index_dense_t& index = impl_->index;
  const us::default_key_t removed = index.free_key();
  std::vector<us::default_key_t> keys;  // by slot, removed nodes included
  for (auto it = index.cbegin(); it != index.cend(); ++it) keys.push_back((*it).key);
  std::vector<char> seen(keys.size(), 0);
  std::vector<size_t> queue;
  if (impl_->entry < keys.size()) {
    seen[impl_->entry] = 1;
    queue.push_back(impl_->entry);
  }
  for (size_t head = 0; head < queue.size(); ++head) {
    const us::default_key_t key = keys[queue[head]];
    if (key == removed) continue;  // its links are reached only through its key, which it no longer has
    for (size_t level = 0, top = index.level_of(key); level <= top; ++level) {
      const auto links = index.neighbors(key, level);
      for (auto it = links.begin(); it != links.end(); ++it) {
        const size_t slot = it.slot();
        if (slot < seen.size() && !seen[slot]) {
          seen[slot] = 1;
          queue.push_back(slot);
        }
      }
    }
  }
  std::vector<uint64_t> out;
  for (size_t slot = 0; slot < keys.size(); ++slot)
    if (!seen[slot] && keys[slot] != removed) out.push_back(static_cast<uint64_t>(keys[slot]));
  return out;
}

void Graph::search(const float* q, size_t count, const State& state, std::vector<int64_t>& out) const {
  const us::index_dense_t& index = impl_->index;
  const size_t n = index.size();
  count = std::min(count, n);
  if (count == 0) return;
  // A filtered walk looks up every node it visits in the state (hundreds per search); a plain walk
  // looks up none, and State::search skips the dead rows among its candidates. So walk plainly for a
  // margin more candidates when that margin is small: the dead rows are few (a fork's own ops: `count`
  // + that many always hold `count` live ones), or a small share of the base (a bank between
  // compactions: twice the expected dead candidates plus slack, checked, and walked again filtered in
  // the rare case the dead cluster near the query).
  const size_t dead = static_cast<size_t>(state.base_dead());
  const size_t base = static_cast<size_t>(std::max<int64_t>(state.base_size(), 1));
  const bool few = dead <= count, rare = dead * 8 <= base;
  const size_t want = std::min(n, few ? count + dead : count + 2 * ((count * dead + base - 1) / base) + 8);
  std::vector<us::default_key_t> keys(few || rare ? want : count);
  struct Context {  // returned to the pool however the search ends
    Impl& g;
    size_t id;
    ~Context() { g.release(id); }
  } context{*impl_, impl_->acquire()};
  auto dump = [&](us::index_dense_t::search_result_t& found) {
    check(found, "HNSW search");
    return found.dump_to(keys.data(), keys.size());
  };
  auto take = [&](size_t got) {
    for (size_t i = 0; i < got; ++i) out.push_back(static_cast<int64_t>(keys[i]));
  };
  if (few || rare) {
    auto found = index.search(q, keys.size(), context.id);
    size_t got = dump(found), live = 0;
    if (!few)
      for (size_t i = 0; i < got; ++i) live += state.base_row_live(static_cast<int64_t>(keys[i]));
    if (few || live >= count || got == n) return take(got);
  }
  // keys are base rows: the walk skips those no longer live in this state
  auto found = index.filtered_search(q, count, [&](us::default_key_t key) {
    return state.base_row_live(static_cast<int64_t>(key));
  }, context.id);
  take(dump(found));
}

}  // namespace memr1
