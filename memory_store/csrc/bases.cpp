// The native rows of a base segment: from the segment's Python rows (open, compaction in the
// foreground) or copied from a snapshot's live records (State.rebased, compaction in the background).
#include <cmath>

#include "convert.h"

namespace memr1 {
namespace {
// Each base row's inverse norm, on the record and in the base's contiguous copy.
void fill_norms(Base& base, int dim) {
  base.inv_norms.resize(static_cast<size_t>(base.n));
  for (Record* r : base.rows) {
    const double ss = sum_squares(r->vec, dim);
    r->inv_norm = ss > 0 ? static_cast<float>(1.0 / std::sqrt(ss)) : 0.f;
    base.inv_norms[static_cast<size_t>(r->base_row)] = r->inv_norm;
  }
}

}  // namespace

std::shared_ptr<Base> make_base(py::array vectors, py::list rows, int dim) {
  auto base = std::make_shared<Base>();
  base->n = static_cast<int64_t>(py::len(rows));
  if (base->n) {
    if (vectors.dtype().kind() != 'f' || vectors.itemsize() != 4 || vectors.ndim() != 2 ||
        vectors.shape(0) != base->n || vectors.shape(1) != dim || !(vectors.flags() & py::array::c_style))
      throw BadInput("base vectors must be a C-contiguous float32 array of shape (rows, dim)");
    base->vectors = static_cast<const float*>(vectors.data());
    // The last owner may drop the base without the GIL (a search's snapshot); the deleter takes it.
    base->keepalive = std::shared_ptr<void>(new py::object(vectors), [](void* p) {
      py::gil_scoped_acquire gil;
      delete static_cast<py::object*>(p);
    });
  }
  base->rows.reserve(static_cast<size_t>(base->n));
  for (int64_t i = 0; i < base->n; ++i) {
    auto t = rows[static_cast<size_t>(i)].cast<py::tuple>();
    auto* r = new Record();
    r->id = t[0].cast<int64_t>();
    r->text = t[1].cast<std::string>();
    r->speaker = speaker_code(t[2].cast<std::string>());
    r->timestamp = t[3].cast<std::string>();
    r->created = t[4].cast<int64_t>();
    r->updated = t[5].cast<int64_t>();
    r->has_prev = !t[6].is_none();
    if (r->has_prev) r->prev_text = t[6].cast<std::string>();
    if (t.size() > 7) {  // segment rows carry the sources the records file holds (none before they existed)
      Sources src = as_sources(t[7]);
      if (!src.empty()) r->sources = std::make_shared<const Sources>(std::move(src));
    }
    r->base_row = i;
    r->vec = base->vectors + i * dim;
    base->rows.push_back(r);
    base->speakers.push_back(r->speaker);
  }
  {
    py::gil_scoped_release nogil;  // O(n * dim), on records no other thread can see yet
    fill_norms(*base, dim);
  }
  return base;
}

// A base whose rows are copies of `recs` (a snapshot's live records, id order) over `vectors` (their
// vectors, same order, already validated): what set_base(make_base(...)) builds from the segment's rows,
// without turning each row into Python objects and back. Each row keeps its record's inverse norm, which
// fill_norms would compute again from the same vector (sum_squares), so `vectors` (a new file's mapping)
// is only touched, a byte a page. Runs without the GIL: `recs` belong to a snapshot the caller keeps
// alive, and the new records are visible to no other thread yet.
std::shared_ptr<Base> copy_base(const std::vector<const Record*>& recs, const float* vectors, int dim) {
  auto base = std::make_shared<Base>();
  base->n = static_cast<int64_t>(recs.size());
  base->vectors = vectors;
  base->rows.reserve(recs.size());
  base->speakers.reserve(recs.size());
  base->inv_norms.reserve(recs.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    const Record* src = recs[i];
    auto* r = new Record();
    r->id = src->id;
    r->speaker = src->speaker;
    r->text = src->text;
    r->timestamp = src->timestamp;
    r->prev_text = src->prev_text;
    r->has_prev = src->has_prev;
    r->sources = src->sources;
    r->created = src->created;
    r->updated = src->updated;
    r->base_row = static_cast<int64_t>(i);
    r->vec = vectors + i * dim;
    r->inv_norm = src->inv_norm;
    base->rows.push_back(r);
    base->speakers.push_back(r->speaker);
    base->inv_norms.push_back(r->inv_norm);
  }
  // A new file's mapping faults each page in on its first read: done here, in the compaction, so that
  // the first searches over the new base do not pay for it.
  const volatile unsigned char* bytes = reinterpret_cast<const unsigned char*>(vectors);
  const size_t total = recs.size() * static_cast<size_t>(dim) * sizeof(float);
  unsigned char seen = 0;
  for (size_t at = 0; at < total; at += 4096) seen ^= bytes[at];
  (void)seen;
  return base;
}
}  // namespace memr1
