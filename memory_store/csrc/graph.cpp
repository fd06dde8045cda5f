// Graph (graph.h) over the bytes of an index_dense_t, the type usearch's Python package saves: a file
// mapped read-only, or a copy of serialized bytes. usearch's header-only core (of the installed
// package's version, compiled without its optional SIMD library) views the bytes first, which checks
// them; the walk (walk.h) then reads the same bytes through its own parse of the layout, checked node by
// node and against usearch's view of them. The bank's default graph (i8, cosine) is walked with the
// per-node sums of cosine_i8.h; other graphs with usearch's own metric. Candidates are re-scored exactly
// in f32 by State::search.
#include "graph.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include <usearch/index_dense.hpp>

#include "core.h"
#include "cosine_i8.h"
#include "walk.h"

namespace memr1 {

namespace us = unum::usearch;

namespace {
// usearch's results carry an error that throws from its destructor when left unread; read it here.
template <class R> void check(R& result, const std::string& what) {
  if (result) return;
  std::string msg = result.error.release();
  throw LogFormat(what + ": " + msg);
}

// The reference search's i8 cosine (usearch's array-array-size signature, pointers as words): the
// walk's distance, from the plain three sums.
float cos_i8_exact(size_t a, size_t b, size_t dim) {
  return cos_i8_reference(reinterpret_cast<const int8_t*>(a), reinterpret_cast<const int8_t*>(b), dim);
}

}  // namespace

struct Graph::Impl {
  // The bytes (declared first, so they outlive the index that views them): a mapping of the file, or a
  // copy of serialized bytes.
  void* mapped = nullptr;
  size_t mapped_bytes = 0;
  std::vector<uint8_t> owned;
  us::index_dense_t index;  // the check of the bytes, unreachable() and the reference search
  walk::Layout layout;
  size_t beam = 0;
  bool i8_cosine = false;
  std::vector<I8Sums> sums;  // per slot, for i8 cosine graphs
  us::casts_punned_t casts;
  struct Context {  // one search at a time
    walk::Scratch scratch;
    std::vector<us::byte_t> cast;  // the query in the graph's scalar type
    QueryI8 query;
  };
  std::vector<Context> contexts;
  // A search waits for a free context: as many as cores, so more concurrent searches only queue.
  std::mutex mu;
  std::condition_variable freed;
  std::vector<size_t> free;

  ~Impl() {
    if (mapped) ::munmap(mapped, mapped_bytes);
  }
  size_t acquire() {
    std::unique_lock<std::mutex> lock(mu);
    freed.wait(lock, [&] { return !free.empty(); });
    size_t id = free.back();
    free.pop_back();
    return id;
  }
  void release(size_t id) {
    { std::lock_guard<std::mutex> lock(mu); free.push_back(id); }
    freed.notify_one();
  }

  void open(const uint8_t* data, size_t n, size_t search_beam, const std::string& what) {
    if (search_beam == 0) throw BadInput("a graph's search beam must be >= 1");
    auto* bytes = const_cast<us::byte_t*>(reinterpret_cast<const us::byte_t*>(data));  // view() only reads
    auto viewed = index.view(us::memory_mapped_file_t(bytes, n));
    check(viewed, what + " is not a usearch index");
    layout = walk::parse(data, n, what);
    size_t slot = 0;
    for (auto it = index.cbegin(); it != index.cend(); ++it, ++slot)
      if (slot >= layout.size || layout.keys[slot] != uint64_t((*it).key))
        throw LogFormat(what + ": its layout is not the one usearch reads");
    if (slot != layout.size || layout.stride != index.bytes_per_vector())
      throw LogFormat(what + ": its layout is not the one usearch reads");
    beam = search_beam;
    index.change_expansion_search(beam);
    casts = us::casts_punned_t::make(index.scalar_kind());
    i8_cosine = index.metric_kind() == us::metric_kind_t::cos_k && index.scalar_kind() == us::scalar_kind_t::i8_k;
    if (i8_cosine) {
      sums.resize(layout.size);
      for (size_t s = 0; s < layout.size; ++s)
        sums[s] = i8_sums(reinterpret_cast<const int8_t*>(layout.vector(uint32_t(s))), layout.stride);
      index.change_metric(us::metric_punned_t::stateless(
          index.dimensions(), reinterpret_cast<std::uintptr_t>(cos_i8_exact),
          us::metric_punned_signature_t::array_array_size_k, us::metric_kind_t::cos_k, us::scalar_kind_t::i8_k));
    }
    const size_t threads = std::max<size_t>(std::thread::hardware_concurrency(), 1);
    if (!index.try_reserve(us::index_limits_t(index.size(), threads)))
      throw LogFormat(what + ": cannot reserve search contexts");
    contexts.resize(threads);
    for (size_t i = 0; i < threads; ++i) free.push_back(i);
  }

  // The walk's `wanted` nearest keys among those `allow(key)` admits (removed nodes never), into `keys`.
  template <class Allow>
  void walk(Context& c, const float* q, size_t wanted, Allow&& allow, std::vector<uint64_t>& keys) const {
    const auto* query = reinterpret_cast<const us::byte_t*>(q);
    c.cast.resize(index.bytes_per_vector());
    if (casts.from.f32 && casts.from.f32(query, index.dimensions(), c.cast.data())) query = c.cast.data();
    const uint64_t removed = index.free_key();
    auto admits = [&](uint32_t slot) { return layout.keys[slot] != removed && allow(layout.keys[slot]); };
    if (i8_cosine) {
      c.query.set(reinterpret_cast<const int8_t*>(query), layout.stride);
      walk::search(layout, c.scratch, wanted, beam, [&](uint32_t slot) {
        const I8Sums& b = sums[slot];
        const auto* v = reinterpret_cast<const int8_t*>(layout.vector(slot));
        return cos_from_sums(dot_i8(c.query, v, b.sum, layout.stride), c.query, b);
      }, admits);
    } else {
      const auto& metric = index.metric();
      walk::search(layout, c.scratch, wanted, beam, [&](uint32_t slot) {
        return metric(query, reinterpret_cast<const us::byte_t*>(layout.vector(slot)));
      }, admits);
    }
    keys.clear();
    for (size_t i = 0; i < c.scratch.top.size(); ++i) keys.push_back(layout.keys[c.scratch.top.data()[i].slot]);
  }
};

Graph::Graph() : impl_(new Impl) {}
Graph::~Graph() = default;

std::shared_ptr<Graph> Graph::view(const std::string& path, size_t beam) {
  std::shared_ptr<Graph> g(new Graph);
  Impl& impl = *g->impl_;
  const int fd = open_file(path, O_RDONLY, "HNSW graph");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw IoError(err, os_error("cannot read", path, err));
  }
  if (st.st_size <= 0) {
    ::close(fd);
    throw LogFormat(path + " is not a usearch index: it is empty");
  }
  void* at = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (at == MAP_FAILED) throw IoError(err, os_error("cannot map", path, err));
  impl.mapped = at, impl.mapped_bytes = size_t(st.st_size);
  impl.open(static_cast<const uint8_t*>(at), impl.mapped_bytes, beam, path);
  return g;
}

std::shared_ptr<Graph> Graph::load(const uint8_t* data, size_t n, size_t beam) {
  std::shared_ptr<Graph> g(new Graph);
  g->impl_->owned.assign(data, data + n);
  g->impl_->open(g->impl_->owned.data(), n, beam, "a serialized usearch index");
  return g;
}

size_t Graph::size() const { return impl_->index.size(); }
size_t Graph::dim() const { return impl_->index.dimensions(); }
size_t Graph::expansion() const { return impl_->beam; }

std::vector<uint64_t> Graph::unreachable() const {
  const walk::Layout& g = impl_->layout;
  const uint64_t removed = impl_->index.free_key();
  std::vector<char> seen(g.size, 0);
  std::vector<uint32_t> queue;
  if (g.size) {
    seen[g.entry] = 1;
    queue.push_back(uint32_t(g.entry));
  }
  for (size_t head = 0; head < queue.size(); ++head) {
    const uint32_t slot = queue[head];
    if (g.keys[slot] == removed) continue;  // a tombstone's links are not followed (the safe side)
    for (int level = 0, top = g.level(slot); level <= top; ++level) {
      const auto [links, count] = g.links(slot, size_t(level));
      for (uint32_t i = 0; i < count; ++i) {
        const uint32_t next = walk::slot_at(links, i);
        if (!seen[next]) seen[next] = 1, queue.push_back(next);
      }
    }
  }
  std::vector<uint64_t> out;
  for (size_t slot = 0; slot < g.size; ++slot)
    if (!seen[slot] && g.keys[slot] != removed) out.push_back(g.keys[slot]);
  return out;
}

namespace {
struct Lease {  // a context, returned to the pool however the search ends
  Graph::Impl& g;
  size_t id;
  explicit Lease(Graph::Impl& graph) : g(graph), id(graph.acquire()) {}
  ~Lease() { g.release(id); }
};
}  // namespace

void Graph::search(const float* q, size_t count, const State& state, std::vector<int64_t>& out) const {
  const size_t n = impl_->index.size();
  count = std::min(count, n);
  if (count == 0) return;
  // A filtered walk looks up every node it admits in the state; a plain walk looks up none, and
  // State::search skips the dead rows among its candidates. So walk plainly for a margin more
  // candidates when that margin is small: the dead rows are few (a fork's own ops: `count` + that many
  // always hold `count` live ones), or a small share of the base (a bank between compactions: twice the
  // expected dead candidates plus slack, checked, and walked again filtered in the rare case the dead
  // cluster near the query).
  const size_t dead = static_cast<size_t>(state.base_dead());
  const size_t base = static_cast<size_t>(std::max<int64_t>(state.base_size(), 1));
  const bool few = dead <= count, rare = dead * 8 <= base;
  Lease lease(*impl_);
  Impl::Context& c = impl_->contexts[lease.id];
  std::vector<uint64_t> keys;
  auto take = [&] {
    for (uint64_t key : keys) out.push_back(static_cast<int64_t>(key));
  };
  if (few || rare) {
    const size_t want = std::min(n, few ? count + dead : count + 2 * ((count * dead + base - 1) / base) + 8);
    impl_->walk(c, q, want, [](uint64_t) { return true; }, keys);
    size_t live = 0;
    if (!few)
      for (uint64_t key : keys) live += state.base_row_live(static_cast<int64_t>(key));
    if (few || live >= count || keys.size() == n) return take();
  }
  // keys are base rows: the walk skips those no longer live in this state
  impl_->walk(c, q, count, [&](uint64_t key) { return state.base_row_live(static_cast<int64_t>(key)); }, keys);
  take();
}

std::vector<uint64_t> Graph::candidates(const float* q, size_t count, const std::vector<uint64_t>& excluded,
                                        bool reference) const {
  auto allow = [&](uint64_t key) { return !std::binary_search(excluded.begin(), excluded.end(), key); };
  Lease lease(*impl_);
  std::vector<uint64_t> keys(std::min(count, impl_->index.size()));
  if (reference) {
    auto found = impl_->index.filtered_search(q, keys.size(), allow, lease.id);
    check(found, "HNSW search");
    keys.resize(found.dump_to(keys.data(), keys.size()));
  } else {
    impl_->walk(impl_->contexts[lease.id], q, keys.size(), allow, keys);
  }
  return keys;
}

}  // namespace memr1
