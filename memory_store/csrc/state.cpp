// Bank state: op application and fork bookkeeping (search.cpp searches it). See core.h for the layout.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core.h"


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
int64_t find_speaker(const std::string& s) {
  auto it = speaker_ids().find(s);
  return it == speaker_ids().end() ? int64_t(-1) : int64_t(it->second);
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
void State::validate_vector(const float* v, int dim, float* inv_norm, bool bounded) {
  // A float squared in double never overflows, so the total is finite exactly when every value is,
  // and only then is the loop skipped.
  const double ss = sum_squares(v, dim);
  if (!std::isfinite(ss))
    for (int i = 0; i < dim; ++i)
      if (!std::isfinite(v[i]))
        throw BadInput("vector has a non-finite value (" + std::to_string(v[i]) + ") at index " + std::to_string(i));
  if (ss == 0) throw BadInput("vector is all zeros; cosine similarity is undefined for it");
  const double norm = std::sqrt(ss);
  if (bounded && !(norm >= kMinNorm && norm <= kMaxNorm)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "vector norm %.3g is outside [2**-32, 2**32]; its float32 scores would "
                  "overflow or underflow (rescale it, e.g. to unit length)", norm);
    throw BadInput(buf);
  }
  *inv_norm = static_cast<float>(1.0 / norm);
}

void State::check_label(const std::string& s, const char* what, size_t max_bytes) {
  if (s.size() > max_bytes)
    throw BadInput(std::string(what) + " is " + std::to_string(s.size()) + " bytes, over the limit of " +
                   std::to_string(max_bytes));
}

void State::check_text(const std::string& text, const char* what) const {
  if (text.empty()) throw BadInput(std::string(what) + " is empty");
  if (text.size() > max_text_)
    throw BadInput(std::string(what) + " is " + std::to_string(text.size()) + " bytes, over the limit of " +
                   std::to_string(max_text_) + " (BankConfig.max_text_bytes)");
}

void State::check_sources(const Sources& sources) {
  if (sources.size() > kMaxOpSources)
    throw BadInput("sources holds " + std::to_string(sources.size()) + " turn ids, over the limit of " +
                   std::to_string(kMaxOpSources) + " per op");
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::string& s = sources[i];
    const std::string at = "sources[" + std::to_string(i) + "]";
    if (s.empty()) throw BadInput(at + " is empty; a turn id is 1.." + std::to_string(kMaxSourceBytes) + " bytes");
    if (s.size() > kMaxSourceBytes)
      throw BadInput(at + " is " + std::to_string(s.size()) + " bytes, over the limit of " +
                     std::to_string(kMaxSourceBytes) + " per turn id");
  }
}

SourcesPtr State::merge_sources(const SourcesPtr& old, const Sources& extra) {
  if (extra.empty()) return old;
  const size_t have = old ? old->size() : 0;
  // Linear probes while small (the usual few ids); a hash set once a probe pass would cost more.
  std::unordered_set<std::string_view> index;
  const bool hashed = have * extra.size() > 4096;
  if (hashed) index.insert(old->begin(), old->end());
  std::vector<const std::string*> fresh;
  for (const std::string& s : extra) {
    bool dup = false;
    if (hashed) dup = index.count(s) > 0;
    else if (old) for (const std::string& o : *old) if (o == s) { dup = true; break; }
    for (size_t j = 0; !dup && j < fresh.size(); ++j) dup = *fresh[j] == s;
    if (!dup) fresh.push_back(&s);
  }
  if (fresh.empty()) return old;
  if (have + fresh.size() > kMaxMemorySources)
    throw BadInput("the memory would hold " + std::to_string(have + fresh.size()) +
                   " source turn ids, over the limit of " + std::to_string(kMaxMemorySources) + " per memory");
  auto out = std::make_shared<Sources>();
  out->reserve(have + fresh.size());
  if (old) out->insert(out->end(), old->begin(), old->end());
  for (const std::string* s : fresh) out->push_back(*s);
  return out;
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
                   const std::string& timestamp, const float* vec, const Sources& sources, bool bounded) {
  check_text(text, "memory text");
  if (speaker.empty()) throw BadInput("speaker is empty");
  if (bounded) {
    check_label(speaker, "speaker", kMaxSpeakerBytes);
    check_label(timestamp, "timestamp", kMaxTimestampBytes);
  }
  float inv;
  validate_vector(vec, dim_, &inv, bounded);
  check_sources(sources);
  SourcesPtr merged = merge_sources(nullptr, sources);
  const int64_t id = next_id_;
  if (sink) sink->put(encode_add(id, text, speaker, timestamp, vec, dim_, sources));
  Record* r = new_record(id, text, vec, inv);
  r->speaker = speaker_code(speaker);
  r->timestamp = timestamp;
  r->sources = std::move(merged);
  r->created = r->updated = lsn_++;
  ids_.set(static_cast<uint64_t>(id), r);
  put_delta(r);
  ++next_id_;
  ++live_;
  return id;
}

void State::update(RecordSink* sink, int64_t id, const std::string& text, const std::string* timestamp,
                   const float* vec, const Sources& sources, bool bounded) {
  const Record* old = get(id);
  if (!old) throw UnknownId(id);
  check_text(text, "memory text");
  if (bounded && timestamp) check_label(*timestamp, "timestamp", kMaxTimestampBytes);
  float inv;
  validate_vector(vec, dim_, &inv, bounded);
  check_sources(sources);
  SourcesPtr merged = merge_sources(old->sources, sources);  // may refuse: the per-memory limit
  if (sink) sink->put(encode_update(id, text, timestamp, vec, dim_, sources));
  Record* r = new_record(id, text, vec, inv);
  r->speaker = old->speaker;
  r->sources = std::move(merged);
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

std::vector<const Record*> State::live() const {
  std::vector<const Record*> out;
  out.reserve(static_cast<size_t>(live_));
  ids_.for_each([&](Record* r) { out.push_back(r); });
  return out;
}

}  // namespace memr1
