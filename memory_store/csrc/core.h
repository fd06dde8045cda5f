// memr1 memory_store native core.
//
// A bank's state is two persistent (copy-on-write) 32-way tries: `ids` maps a memory id to its live
// Record, `delta` lists every Record written since the base segment was built. A fork copies two root
// pointers, and a write copies only the 4-5 trie nodes on its path when they are shared with a fork, so
// every op is O(log32 n): at most 5 levels up to 32M ids. Every write and every reference-count change
// runs under the Python GIL, which is why reference counts are plain integers. A search releases the GIL
// while it scans a private fork (a snapshot taken under the GIL): a concurrent writer then finds the
// snapshot's nodes shared (rc > 1) and copies them before writing, so the scan never sees a change.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace memr1 {

// ---- errors, translated to memr1.memory_store.errors in module.cpp ----
struct UnknownId : std::runtime_error {
  int64_t id;
  explicit UnknownId(int64_t i) : std::runtime_error("unknown memory id"), id(i) {}
};
struct BadInput : std::runtime_error { using std::runtime_error::runtime_error; };
struct CorruptLog : std::runtime_error {
  uint64_t offset;
  CorruptLog(const std::string& m, uint64_t off) : std::runtime_error(m), offset(off) {}
};
struct LogFormat : std::runtime_error { using std::runtime_error::runtime_error; };
struct ForkedHandle : std::runtime_error { using std::runtime_error::runtime_error; };  // ReadOnlyBank
struct IoError : std::runtime_error {  // the file system refused: ENOSPC, EIO, EACCES... (errno in `err`)
  int err;
  IoError(int e, const std::string& m) : std::runtime_error(m), err(e) {}
};

uint32_t crc32c(uint32_t crc, const void* data, size_t n);
// (size, CRC32C) of a whole file, read with pread so a damaged or shrinking file is an error, not a SIGBUS.
std::pair<uint64_t, uint32_t> file_crc32c(const std::string& path);
// files.cpp: `what path: strerror(err)`; a regular file opened without following a symlink or waiting on
// a FIFO (LogFormat when missing or not regular, IoError otherwise); up to `n` bytes at `off` (fewer at
// the end of the file).
std::string os_error(const std::string& what, const std::string& path, int err);
int open_file(const std::string& path, int flags, const char* what);
uint64_t read_at(int fd, uint8_t* out, uint64_t n, uint64_t off, const std::string& path);

// ---- records ----
// A memory's source turns: the dialogue turn ids (e.g. "D3:7") its ADD and UPDATEs came from, in order,
// without duplicates (Memory-R2's evidence recall reads them). Bounded per op and per memory, so a
// record stays small however often it is updated; a violation is BadInput, before anything changes.
constexpr size_t kMaxOpSources = 64;       // turn ids one ADD or UPDATE may carry
constexpr size_t kMaxSourceBytes = 64;     // UTF-8 bytes of one turn id
constexpr size_t kMaxMemorySources = 1024; // distinct turn ids one memory may collect
// Speaker and timestamp sizes, so one op cannot grow the log and every record by megabytes.
constexpr size_t kMaxSpeakerBytes = 1024;
constexpr size_t kMaxTimestampBytes = 256;
// A vector's L2 norm must lie in [2^-32, 2^32]: then a float32 dot product of two of them, its partial
// sums and the scaled score neither overflow (3e38 components) nor lose the score to underflow (denormals).
constexpr double kMinNorm = 1.0 / 4294967296.0, kMaxNorm = 4294967296.0;
using Sources = std::vector<std::string>;
// Immutable once built: record versions an UPDATE adds no new id to share it (no copy per update or fork).
using SourcesPtr = std::shared_ptr<const Sources>;

struct Record {
  int32_t rc = 1;
  int64_t id = 0;
  uint32_t speaker = 0;            // interned, see speaker_code()
  std::string text, timestamp, prev_text;
  bool has_prev = false;
  SourcesPtr sources;              // null: none
  int64_t created = 0, updated = 0;  // op sequence numbers (lsn), not wall clock
  int64_t base_row = -1;           // >= 0 when this version lives in the base segment
  float inv_norm = 0.f;
  const float* vec = nullptr;      // into the base mapping, or into `own`
  std::unique_ptr<float[]> own;
};
// The squared norm every record's inv_norm comes from (1 / sqrt of it, as a float), whether its
// vector came in an op or from a segment, so a row scores the same in every base it is copied to.
// Eight running sums: independent, so the loop vectorises.
inline double sum_squares(const float* v, int dim) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= dim; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += double(v[i + j]) * v[i + j];
  for (; i < dim; ++i) part[0] += double(v[i]) * v[i];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

inline void retain(Record* r) { if (r) ++r->rc; }
inline void release(Record* r) { if (r && --r->rc == 0) delete r; }

uint32_t speaker_code(const std::string& s);
// The code of a speaker some record has had, or -1: a search filter looks speakers up without interning
// them, so filters for speakers no memory has cost nothing to keep.
int64_t find_speaker(const std::string& s);
const std::string& speaker_name(uint32_t code);

// ---- persistent trie: index -> Record* ----
// Inner nodes hold Node*, leaves (level 0) hold Record*. A node shared by two tries (rc > 1) is copied
// before it is written.
struct Node {
  int32_t rc = 1;
  void* slot[32] = {};
};
class Trie {
 public:
  Trie() = default;
  Trie(const Trie& o);             // O(1): shares the root
  Trie& operator=(const Trie& o);
  ~Trie();
  Record* get(uint64_t i) const;
  void set(uint64_t i, Record* r);  // takes over one reference to r; releases the old value
  template <class F> void for_each(F&& f) const { if (root_) walk(root_, shift_, f); }  // index order
  // f(slots) per leaf: its 32 Record* slots (null where empty), in index order.
  template <class F> void for_each_leaf(F&& f) const { if (root_) walk_leaves(root_, shift_, f); }
 private:
  template <class F> static void walk(const Node* n, int shift, F& f) {
    for (void* s : n->slot) {
      if (!s) continue;
      if (shift == 0) f(static_cast<Record*>(s));
      else walk(static_cast<const Node*>(s), shift - 5, f);
    }
  }
  template <class F> static void walk_leaves(const Node* n, int shift, F& f) {
    if (shift == 0) { f(n->slot); return; }
    for (void* s : n->slot)
      if (s) walk_leaves(static_cast<const Node*>(s), shift - 5, f);
  }
  Node* root_ = nullptr;
  int shift_ = 0;                   // bits below the root level
};

// ---- where encoded op records go: the durable log, or a batch buffer ----
struct RecordSink {
  virtual ~RecordSink() = default;
  virtual void put(const std::string& rec) = 0;
};
struct BatchBuffer : RecordSink {
  std::vector<std::string> records;
  void put(const std::string& rec) override { records.push_back(rec); }
};

// ---- the immutable base segment (shared by all forks) ----
// Each base row's unit vector u as i8 codes c and a scale, so that u ~ scale * c, with err = |u - scale * c|:
// search_many scores a base from these first (4 bytes a dimension fewer to read, 4x the products per
// instruction) and re-scores in float32 only the rows the error bound cannot rule out (search.cpp).
struct BaseCodes {
  std::vector<int8_t> codes;       // [n, dim]
  std::vector<int32_t> sums;       // sum(c) per row, for the VNNI kernel
  std::vector<float> scale, err;
};
struct Base {
  int64_t n = 0;
  const float* vectors = nullptr;  // [n, dim], memory-mapped by the Python side
  std::vector<Record*> rows;       // one reference each
  // Per-row copies of what the search loop reads, contiguous so the scan never chases record pointers.
  std::vector<float> inv_norms;
  std::vector<uint32_t> speakers;
  std::shared_ptr<void> keepalive; // holds the Python buffer alive (its deleter takes the GIL)
  ~Base() { for (auto* r : rows) release(r); }
  // Made by the first search_many over this base (graph bases never need them), once, by whichever
  // thread gets there first; O(n * dim).
  const BaseCodes& i8(int dim) const;
 private:
  mutable std::once_flag i8_once_;
  mutable BaseCodes i8_;
};

struct Hit { float score; int64_t id; };
struct TopK;       // search.cpp: the best k hits of one search
struct I8Scratch;  // search.cpp: search_many's buffers for scan_base_i8

class State {
 public:
  State(int dim, size_t max_text_bytes);
  State fork() const { return *this; }

  // `bounded`: apply the size and norm bounds that came after the log format (false when replaying a
  // log, which may hold ops from before them).
  int64_t add(RecordSink* sink, const std::string& text, const std::string& speaker,
              const std::string& timestamp, const float* vec, const Sources& sources = {}, bool bounded = true);
  // `sources`: this UPDATE's turn ids, appended to the memory's (those it already holds are dropped).
  void update(RecordSink* sink, int64_t id, const std::string& text, const std::string* timestamp,
              const float* vec, const Sources& sources = {}, bool bounded = true);
  void remove(RecordSink* sink, int64_t id);
  void noop(RecordSink* sink);

  // Replaces everything with a base built from these rows; the trie is rebuilt (O(n), compaction only).
  void set_base(std::shared_ptr<Base> base, int64_t next_id, int64_t lsn);

  const Record* get(int64_t id) const;  // nullptr when unknown or deleted
  bool base_row_live(int64_t row) const;
  // Exact top-k over the delta plus, when `base_rows` is null, every base row; otherwise only the
  // given base rows (candidates from an HNSW index), which are re-scored exactly here.
  std::vector<Hit> search(const float* q, int k, int64_t speaker, const std::vector<int64_t>* base_rows) const;
  // The exact top-k of `states[i]` for query row i of `queries` ([n, dim]), for states over one base
  // (forks of one bank): n calls of search() with every base row. The base is scored from its i8 codes
  // and only the rows their error bound leaves in contention are scored in float32, as search() does.
  static std::vector<std::vector<Hit>> search_many(const std::vector<const State*>& states, const float* queries,
                                                   int k, int64_t speaker);
  std::vector<const Record*> live() const;  // id order

  int dim() const { return dim_; }
  size_t max_text_bytes() const { return max_text_; }
  int64_t size() const { return live_; }
  int64_t next_id() const { return next_id_; }
  int64_t lsn() const { return lsn_; }
  int64_t delta_len() const { return delta_len_; }
  int64_t base_dead() const { return base_dead_; }
  int64_t base_size() const { return base_ ? base_->n : 0; }

  static void validate_vector(const float* v, int dim, float* inv_norm, bool bounded = true);
  static void check_label(const std::string& s, const char* what, size_t max_bytes);
  static void check_sources(const Sources& sources);  // one op's: count and bytes of each id
  // `old` followed by the ids of `extra` it lacks, in order; `old` itself when none is new.
  static SourcesPtr merge_sources(const SourcesPtr& old, const Sources& extra);

 private:
  void check_text(const std::string& text, const char* what) const;
  int clamp_k(int k) const { return k > live_ ? static_cast<int>(live_) : k; }  // a huge k must not size a heap
  void score_base_row(int64_t row, float dot_q, float qinv, TopK& top) const;
  void scan_delta(const float* q, float qinv, int64_t speaker, TopK& top) const;
  // Every base row (of `speaker`, unless < 0) that the i8 scores' bound cannot rule out, in float32.
  // Query i of a search_many (its codes and i8 scores in `scratch`).
  void scan_base_i8(const float* q, float qinv, size_t i, int64_t speaker, TopK& top, I8Scratch& scratch) const;
  Record* new_record(int64_t id, const std::string& text, const float* vec, float inv_norm);
  void put_delta(Record* r);

  int dim_;
  size_t max_text_;
  std::shared_ptr<Base> base_;
  Trie ids_, delta_;
  int64_t delta_len_ = 0, next_id_ = 0, live_ = 0, base_dead_ = 0, lsn_ = 0;
};

// ---- the append-only op log (oplog.cpp) ----
// The writer maps the log and appends through the mapping; readers copy its valid frames with pread,
// because the writer may trim it (close) or a full disk may leave it short, and a mapping read past the
// end is a SIGBUS. Both check the header (the bank and generation it belongs to) before anything else,
// and nothing is reserved, mapped for writing or copied beyond the frames that check out: a log's length
// is not trusted. The writer reserves disk blocks (fallocate) before its mapping grows over them.
class OpLog : public RecordSink {
 public:
  enum Sync { NEVER = 0, EVERY_OP = 1, EVERY_N = 2, ON_CLOSE = 3 };
  // A record never exceeds this (a text of at most BankConfig.max_text_bytes, 16 MiB, plus a vector of
  // at most 65,536 dims and bounded labels), so a frame claiming more is damage, not a record.
  static constexpr uint32_t kMaxRecord = 1u << 25;
  static void create(const std::string& path, uint64_t generation, uint64_t bank);
  // LogFormat unless the file is an op log of this version, of bank `bank` and generation `generation`.
  OpLog(const std::string& path, bool writable, int sync, int64_t sync_every, uint64_t generation, uint64_t bank);
  ~OpLog() override;
  void put(const std::string& rec) override;   // frame + CRC + append, then the sync policy
  void put_batch(const BatchBuffer& b);
  void sync();
  void close();
  const std::vector<std::pair<uint64_t, uint32_t>>& records() const { return records_; }
  const uint8_t* data() const { return map_; }
  uint64_t end() const { return end_; }
  uint64_t generation() const { return generation_; }
  uint64_t dropped_tail() const { return dropped_tail_; }
  uint64_t torn_record() const { return torn_record_; }
  // True in a process forked after this log was opened: that handle never writes, syncs or trims.
  bool forked() const;

 private:
  void scan();
  const uint8_t* bytes(uint64_t off, uint64_t n);
  template <class Fetch> bool frame_ok(uint64_t off, uint32_t* len, Fetch&& fetch);
  bool valid_frame_after(uint64_t off);
  void reserve(uint64_t extra);
  void append_frame(const std::string& rec);
  void sync_or_take_back(uint64_t start);
  std::string path_;
  int fd_ = -1;
  bool writable_;
  int sync_;
  int64_t sync_every_, unsynced_ = 0;
  uint8_t* map_ = nullptr;
  void check_owner() const;
  bool torn_at(uint64_t off);
  // size_: the file's length when opened (the scan reads no further); cap_: the writer's mapped length.
  uint64_t size_ = 0, cap_ = 0, end_ = 0, synced_to_ = 0, generation_ = 0, dropped_tail_ = 0, torn_record_ = 0;
  uint64_t fork_epoch_ = 0;
  std::vector<std::pair<uint64_t, uint32_t>> records_;  // (payload offset, length) found by scan()
  std::vector<uint8_t> copy_;                           // a reader's copy of the frames; map_ points here
};

// A compaction's record of the ops applied since its snapshot: each record goes to the op log first
// (when there is one), then is kept, so a record the log refused is never kept.
struct Recorder : RecordSink {
  OpLog* log = nullptr;
  std::vector<std::string> records;
  explicit Recorder(OpLog* to) : log(to) {}
  void put(const std::string& rec) override {
    if (log) log->put(rec);
    records.push_back(rec);
  }
  void put_batch(const BatchBuffer& b) {
    if (log) log->put_batch(b);
    records.insert(records.end(), b.records.begin(), b.records.end());
  }
};

// msgpack encoding of op records, matching the msgspec Structs in records.py (array_like, tagged).
// `sources` is a trailing element written only when non-empty: a record without it is the encoding
// from before sources existed, byte for byte, and decodes to the field's default ().
std::string encode_add(int64_t id, const std::string& text, const std::string& speaker,
                       const std::string& ts, const float* vec, int dim, const Sources& sources);
std::string encode_update(int64_t id, const std::string& text, const std::string* ts, const float* vec, int dim,
                          const Sources& sources);
std::string encode_delete(int64_t id);
std::string encode_noop();

}  // namespace memr1
