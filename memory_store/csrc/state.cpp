// Bank state: op application, fork bookkeeping and exact search. See core.h for the layout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "core.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace memr1 {

// ---- speakers are interned so that records and filters compare integers ----
namespace {
std::unordered_map<std::string, uint32_t>& speaker_ids() { static std::unordered_map<std::string, uint32_t> m; return m; }
std::vector<std::string>& speaker_names() { static std::vector<std::string> v; return v; }
}  // namespace

uint32_t speaker_code(const std::string& s) {
  auto& m = speaker_ids();
  auto it = m.find(s);
  if (it != m.end()) return it->second;
  uint32_t code = static_cast<uint32_t>(speaker_names().size());
  speaker_names().push_back(s);
  m.emplace(s, code);
  return code;
}
const std::string& speaker_name(uint32_t code) { return speaker_names().at(code); }

// ---- persistent trie ----
namespace {
void release_node(Node* n, int shift) {
  if (!n || --n->rc > 0) return;
  for (void* s : n->slot) {
    if (!s) continue;
    if (shift == 0) release(static_cast<Record*>(s));
    else release_node(static_cast<Node*>(s), shift - 5);
  }
  delete n;
}
Node* clone(const Node* n, int shift) {
  Node* c = new Node();
  std::memcpy(c->slot, n->slot, sizeof(n->slot));
  for (void* s : c->slot) {
    if (!s) continue;
    if (shift == 0) retain(static_cast<Record*>(s));
    else ++static_cast<Node*>(s)->rc;
  }
  return c;
}
}  // namespace

Trie::Trie(const Trie& o) : root_(o.root_), shift_(o.shift_) { if (root_) ++root_->rc; }
Trie& Trie::operator=(const Trie& o) {
  if (this != &o) {
    if (o.root_) ++o.root_->rc;
    release_node(root_, shift_);
    root_ = o.root_;
    shift_ = o.shift_;
  }
  return *this;
}
Trie::~Trie() { release_node(root_, shift_); }

Record* Trie::get(uint64_t i) const {
  if (!root_ || (i >> shift_) >= 32) return nullptr;
  const Node* n = root_;
  for (int s = shift_; s > 0; s -= 5) {
    n = static_cast<const Node*>(n->slot[(i >> s) & 31]);
    if (!n) return nullptr;
  }
  return static_cast<Record*>(n->slot[i & 31]);
}

void Trie::set(uint64_t i, Record* r) {
  if (!root_) root_ = new Node();
  while ((i >> shift_) >= 32) {  // grow upwards: the old root becomes child 0
    Node* up = new Node();
    up->slot[0] = root_;
    root_ = up;
    shift_ += 5;
  }
  Node** cur = &root_;
  for (int s = shift_;; s -= 5) {
    Node* n = *cur;
    if (!n) {
      n = *cur = new Node();
    } else if (n->rc > 1) {  // shared with a fork: copy this node only
      Node* c = clone(n, s);
      --n->rc;
      n = *cur = c;
    }
    void*& slot = n->slot[(i >> s) & 31];
    if (s == 0) {
      release(static_cast<Record*>(slot));
      slot = r;
      return;
    }
    cur = reinterpret_cast<Node**>(&slot);
  }
}

// ---- validation ----
void State::validate_vector(const float* v, int dim, float* inv_norm) {
  double ss = 0;
  for (int i = 0; i < dim; ++i) {
    if (!std::isfinite(v[i]))
      throw BadInput("vector has a non-finite value (" + std::to_string(v[i]) + ") at index " + std::to_string(i));
    ss += double(v[i]) * v[i];
  }
  if (ss == 0) throw BadInput("vector is all zeros; cosine similarity is undefined for it");
  *inv_norm = static_cast<float>(1.0 / std::sqrt(ss));
}

void State::check_text(const std::string& text, const char* what) const {
  if (text.empty()) throw BadInput(std::string(what) + " is empty");
  if (text.size() > max_text_)
    throw BadInput(std::string(what) + " is " + std::to_string(text.size()) + " bytes, over the limit of " +
                   std::to_string(max_text_) + " (BankConfig.max_text_bytes)");
}

// ---- op application: validate everything, then log, then mutate (so a bad op changes nothing) ----
State::State(int dim, size_t max_text_bytes) : dim_(dim), max_text_(max_text_bytes) {}

Record* State::new_record(int64_t id, const std::string& text, const float* vec, float inv_norm) {
  auto* r = new Record();
  r->id = id;
  r->text = text;
  r->own.reset(new float[dim_]);
  std::memcpy(r->own.get(), vec, sizeof(float) * dim_);
  r->vec = r->own.get();
  r->inv_norm = inv_norm;
  return r;
}

void State::put_delta(Record* r) {
  retain(r);
  delta_.set(static_cast<uint64_t>(delta_len_++), r);
}

int64_t State::add(RecordSink* sink, const std::string& text, const std::string& speaker,
                   const std::string& timestamp, const float* vec) {
  check_text(text, "memory text");
  if (speaker.empty()) throw BadInput("speaker is empty");
  float inv;
  validate_vector(vec, dim_, &inv);
  const int64_t id = next_id_;
  if (sink) sink->put(encode_add(id, text, speaker, timestamp, vec, dim_));
  Record* r = new_record(id, text, vec, inv);
  r->speaker = speaker_code(speaker);
  r->timestamp = timestamp;
  r->created = r->updated = lsn_++;
  ids_.set(static_cast<uint64_t>(id), r);
  put_delta(r);
  ++next_id_;
  ++live_;
  return id;
}

void State::update(RecordSink* sink, int64_t id, const std::string& text, const std::string* timestamp,
                   const float* vec) {
  const Record* old = get(id);
  if (!old) throw UnknownId(id);
  check_text(text, "memory text");
  float inv;
  validate_vector(vec, dim_, &inv);
  if (sink) sink->put(encode_update(id, text, timestamp, vec, dim_));
  Record* r = new_record(id, text, vec, inv);
  r->speaker = old->speaker;
  r->timestamp = timestamp ? *timestamp : old->timestamp;
  r->created = old->created;
  r->updated = lsn_++;
  r->prev_text = old->text;
  r->has_prev = true;
  if (old->base_row >= 0) ++base_dead_;
  ids_.set(static_cast<uint64_t>(id), r);  // releases `old`
  put_delta(r);
}

void State::remove(RecordSink* sink, int64_t id) {
  const Record* old = get(id);
  if (!old) throw UnknownId(id);
  if (sink) sink->put(encode_delete(id));
  if (old->base_row >= 0) ++base_dead_;
  ids_.set(static_cast<uint64_t>(id), nullptr);
  --live_;
  ++lsn_;
}

void State::noop(RecordSink* sink) {
  if (sink) sink->put(encode_noop());
  ++lsn_;
}

void State::set_base(std::shared_ptr<Base> base, int64_t next_id, int64_t lsn) {
  ids_ = Trie();
  delta_ = Trie();
  delta_len_ = base_dead_ = 0;
  live_ = base->n;
  for (Record* r : base->rows) {
    retain(r);
    ids_.set(static_cast<uint64_t>(r->id), r);
  }
  base_ = std::move(base);
  next_id_ = next_id;
  lsn_ = lsn;
}

const Record* State::get(int64_t id) const {
  if (id < 0 || id >= next_id_) return nullptr;
  return ids_.get(static_cast<uint64_t>(id));
}

bool State::base_row_live(int64_t row) const {
  if (!base_ || row < 0 || row >= base_->n) return false;
  const Record* r = base_->rows[row];
  return ids_.get(static_cast<uint64_t>(r->id)) == r;
}

int64_t State::count_live_rows(const int64_t* rows, size_t n) const {
  int64_t live = 0;
  for (size_t i = 0; i < n; ++i) live += base_row_live(rows[i]);
  return live;
}

// ---- exact search ----
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

struct TopK {  // min-heap of the best k hits
  explicit TopK(int k) : k(k) { heap.reserve(k); }
  int k;
  std::vector<Hit> heap;
  static bool worse(const Hit& a, const Hit& b) { return a.score > b.score || (a.score == b.score && a.id < b.id); }
  bool admits(float s) const { return (int)heap.size() < k || s > heap.front().score; }
  void push(Hit h) {
    if ((int)heap.size() < k) { heap.push_back(h); std::push_heap(heap.begin(), heap.end(), worse); return; }
    std::pop_heap(heap.begin(), heap.end(), worse);
    heap.back() = h;
    std::push_heap(heap.begin(), heap.end(), worse);
  }
  std::vector<Hit> sorted() { std::sort_heap(heap.begin(), heap.end(), worse); return heap; }
};
}  // namespace

std::vector<Hit> State::search(const float* q, int k, int64_t speaker, const std::vector<int64_t>* base_rows) const {
  float qinv;
  validate_vector(q, dim_, &qinv);
  if (k > live_) k = static_cast<int>(live_);  // no more hits exist; a huge k must not size the heap
  TopK top(k);
  auto consider_base = [&](int64_t row) {
    if (speaker >= 0 && base_->speakers[row] != speaker) return;
    float s = dot(q, base_->vectors + row * dim_, dim_) * qinv * base_->inv_norms[row];
    if (!top.admits(s)) return;
    const Record* r = base_->rows[row];
    if (base_dead_ && ids_.get(static_cast<uint64_t>(r->id)) != r) return;  // superseded or deleted
    top.push({s, r->id});
  };
  if (base_ && k > 0) {
    if (base_rows) {
      for (int64_t row : *base_rows)
        if (row >= 0 && row < base_->n) consider_base(row);
    } else {
      for (int64_t row = 0; row < base_->n; ++row) consider_base(row);
    }
  }
  if (k > 0) {
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
  return top.sorted();
}

std::vector<const Record*> State::live() const {
  std::vector<const Record*> out;
  out.reserve(static_cast<size_t>(live_));
  ids_.for_each([&](Record* r) { out.push_back(r); });
  return out;
}

}  // namespace memr1
