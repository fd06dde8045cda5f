// Python bindings of the native core. Errors become the exception classes of
// memr1.memory_store.errors, so callers catch one hierarchy whether Python or C++ raised.
// Long pure-C++ work (searches, checksums, log scans, norms and copies) runs with the GIL released and
// touches no Python object meanwhile; its inputs are copied or owned by C++ before the release.
#include <algorithm>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "convert.h"
#include "core.h"
#include "cosine_i8.h"
#include "graph.h"

using namespace memr1;  // brings convert.h's `py` alias of pybind11

namespace {
py::tuple sources_tuple(const Record* r) {
  if (!r->sources) return py::tuple();
  py::tuple t(r->sources->size());
  for (size_t i = 0; i < r->sources->size(); ++i) t[i] = py::str((*r->sources)[i]);
  return t;
}

py::object record_tuple(const Record* r) {
  return py::make_tuple(r->id, r->text, speaker_name(r->speaker), r->timestamp, r->created, r->updated,
                        r->has_prev ? py::object(py::str(r->prev_text)) : py::object(py::none()),
                        sources_tuple(r));
}

py::tuple hits_to_arrays(const std::vector<Hit>& hits) {
  py::array_t<int64_t> ids(static_cast<py::ssize_t>(hits.size()));
  py::array_t<float> scores(static_cast<py::ssize_t>(hits.size()));
  auto* ip = ids.mutable_data();
  auto* sp = scores.mutable_data();
  for (size_t i = 0; i < hits.size(); ++i) { ip[i] = hits[i].id; sp[i] = hits[i].score; }
  return py::make_tuple(ids, scores);
}

// Below this many multiply-adds a search keeps the GIL: handing it back can cost more than the scan.
constexpr size_t kReleaseWork = size_t(1) << 16;

// A fork of a state (which keeps its records alive) and its live records in id order.
struct LiveRows {
  explicit LiveRows(State s) : snap(std::move(s)) {}
  State snap;
  std::vector<const Record*> recs;
};

// The records at positions `at` (int64) of `l`, in that order; BadInput names `what` when one is out of range.
std::vector<const Record*> records_at(const LiveRows& l, py::handle at, const char* what) {
  auto rows = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(at);
  if (!rows) throw py::error_already_set();
  std::vector<const Record*> out;
  out.reserve(static_cast<size_t>(rows.size()));
  for (py::ssize_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows.data()[i];
    if (r < 0 || r >= static_cast<int64_t>(l.recs.size())) throw BadInput(std::string(what) + ": row out of range");
    out.push_back(l.recs[static_cast<size_t>(r)]);
  }
  return out;
}

// A graph may also return its orphans (rows a search for their own vector missed, scored besides the
// graph's candidates): each row is scored once.
void unique_rows(std::vector<int64_t>& rows) {
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
}

// A search's `base_rows` argument into `cand`: false for None (every base row is scanned, which a
// search with graphs may not ask for), true for an array of base rows.
bool base_rows_arg(py::object rows, bool has_graphs, const char* what, std::vector<int64_t>& cand) {
  if (rows.is_none()) {
    if (has_graphs) throw BadInput(std::string(what) + ": graphs need base_rows (the rows searched besides them)");
    return false;
  }
  auto arr = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(rows);
  if (!arr) throw py::error_already_set();
  cand.assign(arr.data(), arr.data() + arr.size());
  return true;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "memr1 memory_store native core: persistent bank state, op log, exact search";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const UnknownId& e) {
      raise_as("UnknownMemoryId", py::make_tuple(e.id));
    } catch (const BadInput& e) {
      raise_as("InvalidInput", py::make_tuple(e.what()));
    } catch (const CorruptLog& e) {
      raise_as("CorruptLog", py::make_tuple(e.what(), e.offset));
    } catch (const LogFormat& e) {
      raise_as("BankFormatError", py::make_tuple(e.what()));
    } catch (const ForkedHandle& e) {
      raise_as("ReadOnlyBank", py::make_tuple(e.what()));
    } catch (const IoError& e) {
      raise_as("BankIOError", py::make_tuple(e.what(), e.err));
    }
  });

  m.def("crc32c", [](py::buffer b) {
    py::buffer_info info = b.request();  // the export keeps the buffer from being resized or freed
    py::gil_scoped_release nogil;
    return crc32c(0, info.ptr, static_cast<size_t>(info.size * info.itemsize));
  });
  m.def("speaker_name", [](uint32_t code) { return speaker_name(code); },  // under the GIL: ops intern new ones
        "the speaker a code of LiveRows.columns() stands for");
  m.def("file_crc32c", &file_crc32c, py::arg("path"), "(size, CRC32C) of a file",
        py::call_guard<py::gil_scoped_release>());

  m.attr("MAX_OP_SOURCES") = kMaxOpSources;
  m.attr("MAX_SOURCE_BYTES") = kMaxSourceBytes;
  m.attr("MAX_MEMORY_SOURCES") = kMaxMemorySources;
  m.attr("MAX_SPEAKER_BYTES") = kMaxSpeakerBytes;
  m.attr("MAX_TIMESTAMP_BYTES") = kMaxTimestampBytes;
  m.attr("MIN_NORM") = kMinNorm;
  m.attr("MAX_NORM") = kMaxNorm;
  m.def("vector", [](py::handle v, int dim) {  // a query as search uses it: a validated private copy
    std::vector<float> q = as_vector(v, dim);
    float inv;
    State::validate_vector(q.data(), dim, &inv);
    py::array_t<float> out(static_cast<py::ssize_t>(dim));
    std::memcpy(out.mutable_data(), q.data(), sizeof(float) * q.size());
    return out;
  }, py::arg("vector"), py::arg("dim"));

  py::class_<RecordSink>(m, "RecordSink");
  py::class_<BatchBuffer, RecordSink>(m, "BatchBuffer")
      .def(py::init<>())
      .def("__len__", [](const BatchBuffer& b) { return b.records.size(); });

  // Records are copied out as bytes under the GIL, so a slice stays valid while ops keep arriving.
  py::class_<Recorder, RecordSink>(m, "Recorder")
      .def(py::init<OpLog*>(), py::arg("log"), py::keep_alive<1, 2>())
      .def("put_batch", &Recorder::put_batch)
      .def("records", [](const Recorder& r, size_t start) {
        py::list out;
        for (size_t i = start; i < r.records.size(); ++i) out.append(py::bytes(r.records[i]));
        return out;
      }, py::arg("start") = 0)
      .def("__len__", [](const Recorder& r) { return r.records.size(); });

  py::class_<OpLog, RecordSink>(m, "OpLog")
      // Opening scans and checksums the whole log. The OpLog methods that release the GIL (open, sync,
      // put_batch, close) are called by one thread at a time: MemoryBank's writer lock.
      .def(py::init([](const std::string& path, bool writable, int sync, int64_t sync_every, uint64_t generation,
                       uint64_t bank) {
             py::gil_scoped_release nogil;
             return std::make_unique<OpLog>(path, writable, sync, sync_every, generation, bank);
           }), py::arg("path"), py::arg("writable"), py::arg("sync"), py::arg("sync_every"), py::arg("generation"),
           py::arg("bank"))
      .def_static("create", &OpLog::create, py::arg("path"), py::arg("generation"), py::arg("bank"))
      .def("payloads", [](const OpLog& log) {  // zero-copy views, valid until close()
        py::list out;
        for (auto [off, len] : log.records())
          out.append(py::memoryview::from_memory(static_cast<const void*>(log.data() + off), static_cast<py::ssize_t>(len)));
        return out;
      })
      .def("put_batch", &OpLog::put_batch, py::call_guard<py::gil_scoped_release>())
      .def("sync", &OpLog::sync, py::call_guard<py::gil_scoped_release>())
      .def("close", &OpLog::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("end", &OpLog::end)
      .def_property_readonly("generation", &OpLog::generation)
      .def_property_readonly("dropped_tail", &OpLog::dropped_tail)
      .def_property_readonly("torn_record", &OpLog::torn_record);

  py::class_<LiveRows>(m, "LiveRows")
      .def("__len__", [](const LiveRows& l) { return l.recs.size(); })
      .def("slice", [](const LiveRows& l, int64_t start, int64_t stop) {  // rows [start, stop) as tuples
        const auto n = static_cast<int64_t>(l.recs.size());
        stop = std::min(stop, n);
        py::list out;
        for (int64_t i = std::max<int64_t>(start, 0); i < stop; ++i) out.append(record_tuple(l.recs[static_cast<size_t>(i)]));
        return out;
      }, py::arg("start"), py::arg("stop"))
      .def("tuples", [](const LiveRows& l, py::handle at) {  // the rows at positions `at`, as slice() gives them
        py::list out;
        for (const Record* r : records_at(l, at, "tuples")) out.append(record_tuple(r));
        return out;
      }, py::arg("at"))
      // [n, dim] float32 in id order; with `rows` (int64 positions), only those rows, in that order.
      .def("vectors", [](const LiveRows& l, py::object rows) {
        const int dim = l.snap.dim();
        const std::vector<const Record*> some = rows.is_none() ? std::vector<const Record*>() : records_at(l, rows, "vectors");
        const auto& recs = rows.is_none() ? l.recs : some;
        py::array_t<float> out({static_cast<py::ssize_t>(recs.size()), static_cast<py::ssize_t>(dim)});
        float* p = out.mutable_data();
        {
          py::gil_scoped_release nogil;  // `out` is not visible to any other thread yet
          for (size_t i = 0; i < recs.size(); ++i) std::memcpy(p + i * dim, recs[i]->vec, sizeof(float) * dim);
        }
        return out;
      }, py::arg("rows") = py::none())
      // (ids, updated, speaker codes) of the rows, id order: what a compaction groups and versions the
      // rows by without a Python object per row (so it holds no GIL for it); speaker_name(code) names a code.
      .def("columns", [](const LiveRows& l) {
        const auto n = static_cast<py::ssize_t>(l.recs.size());
        py::array_t<int64_t> ids(n), updated(n);
        py::array_t<uint32_t> speakers(n);
        int64_t* pi = ids.mutable_data();
        int64_t* pu = updated.mutable_data();
        uint32_t* ps = speakers.mutable_data();
        {
          py::gil_scoped_release nogil;  // the arrays are not visible to any other thread yet
          for (size_t i = 0; i < l.recs.size(); ++i) {
            pi[i] = l.recs[i]->id;
            pu[i] = l.recs[i]->updated;
            ps[i] = l.recs[i]->speaker;
          }
        }
        return py::make_tuple(ids, updated, speakers);
      })
      // Each row's row in the snapshot's base segment, or -1 for a row of the delta (int64, id order):
      // where a compaction can copy a row's vector from the base's file instead of from memory.
      .def("base_rows", [](const LiveRows& l) {
        py::array_t<int64_t> out(static_cast<py::ssize_t>(l.recs.size()));
        int64_t* p = out.mutable_data();
        for (size_t i = 0; i < l.recs.size(); ++i) p[i] = l.recs[i]->base_row;
        return out;
      });

  // A saved HNSW index (graph.h), searched only through State.search.
  py::class_<Graph, std::shared_ptr<Graph>>(m, "Graph")
      .def_static("view", &Graph::view, py::arg("path"), py::arg("expansion_search"),
                  py::call_guard<py::gil_scoped_release>())
      .def_static("load", [](py::buffer b, size_t beam) {  // an index serialized to bytes (Index.save())
        py::buffer_info info = b.request();
        const auto* data = static_cast<const uint8_t*>(info.ptr);
        const size_t n = static_cast<size_t>(info.size * info.itemsize);
        py::gil_scoped_release nogil;
        return Graph::load(data, n, beam);
      }, py::arg("data"), py::arg("expansion_search"))
      .def("unreachable", [](const Graph& g) {  // uint64 keys of the live rows no search reaches
        std::vector<uint64_t> keys;
        {
          py::gil_scoped_release nogil;
          keys = g.unreachable();
        }
        py::array_t<uint64_t> out(static_cast<py::ssize_t>(keys.size()));
        std::copy(keys.begin(), keys.end(), out.mutable_data());
        return out;
      })
      .def_static("cos_i8_kernels", [](py::array_t<int8_t, py::array::c_style> a, py::array_t<int8_t, py::array::c_style> b) {
        if (a.ndim() != 1 || b.ndim() != 1 || a.size() != b.size()) throw BadInput("cos_i8_kernels: two int8 vectors of one length");
        return cos_i8_kernels(a.data(), b.data(), static_cast<size_t>(a.size()));
      })
      .def_static("dots_i8_many_kernels", [](py::array_t<uint8_t, py::array::c_style> shifted,
                                             py::array_t<int8_t, py::array::c_style> rows,
                                             py::array_t<int32_t, py::array::c_style> sums) {
        if (shifted.ndim() != 2 || rows.ndim() != 2 || sums.ndim() != 1 || shifted.shape(1) != rows.shape(1) ||
            sums.size() != rows.shape(0))
          throw BadInput("dots_i8_many_kernels: (m, dim) uint8 queries, (n, dim) int8 rows and their n sums");
        const auto m = shifted.shape(0), n = rows.shape(0), dim = rows.shape(1);
        py::list out;
        for (const auto& [name, kernel] : dots_i8_many_kernels()) {
          py::array_t<int32_t> got({m, n});
          kernel(shifted.data(), static_cast<size_t>(m), rows.data(), sums.data(), n, static_cast<size_t>(dim),
                 static_cast<size_t>(dim), got.mutable_data());
          out.append(py::make_tuple(name, got));
        }
        return out;
      })
      .def("candidates", [](const Graph& g, py::array_t<float, py::array::c_style | py::array::forcecast> q, size_t count,
                            py::array_t<uint64_t, py::array::c_style | py::array::forcecast> excluded, bool reference) {
        if (q.ndim() != 1 || size_t(q.size()) != g.dim()) throw BadInput("candidates: a float32 query of the graph's dim");
        std::vector<uint64_t> skip(excluded.data(), excluded.data() + excluded.size());
        std::sort(skip.begin(), skip.end());
        std::vector<uint64_t> keys;
        {
          py::gil_scoped_release nogil;
          keys = g.candidates(q.data(), count, skip, reference);
        }
        py::array_t<uint64_t> out(static_cast<py::ssize_t>(keys.size()));
        std::copy(keys.begin(), keys.end(), out.mutable_data());
        return out;
      }, py::arg("query"), py::arg("count"), py::arg("excluded") = py::array_t<uint64_t>(0), py::arg("reference") = false)
      .def("__len__", &Graph::size)
      .def_property_readonly("dim", &Graph::dim)
      .def_property_readonly("expansion_search", &Graph::expansion);

  py::class_<State>(m, "State")
      .def(py::init<int, size_t>(), py::arg("dim"), py::arg("max_text_bytes"))
      .def("fork", &State::fork)
      // replay=True: a logged op, applied without the bounds newer than the log (State::add).
      .def("add", [](State& s, RecordSink* sink, py::handle text, py::handle speaker, py::handle ts,
                     py::handle vec, py::handle sources, bool replay) {
        std::string t = as_str(text, "text"), sp = as_str(speaker, "speaker"), when = as_str(ts, "timestamp");
        std::vector<float> v = as_vector(vec, s.dim());
        return s.add(sink, t, sp, when, v.data(), as_sources(sources), !replay);
      }, py::arg("sink"), py::arg("text"), py::arg("speaker"), py::arg("timestamp"), py::arg("vector"),
         py::arg("sources") = py::tuple(), py::arg("replay") = false)
      .def("update", [](State& s, RecordSink* sink, py::handle id, py::handle text, py::handle ts,
                        py::handle vec, py::handle sources, bool replay) {
        int64_t i = as_id(id);
        std::string t = as_str(text, "text");
        std::vector<float> v = as_vector(vec, s.dim());
        Sources src = as_sources(sources);
        if (ts.is_none()) return s.update(sink, i, t, nullptr, v.data(), src, !replay);
        std::string when = as_str(ts, "timestamp");
        s.update(sink, i, t, &when, v.data(), src, !replay);
      }, py::arg("sink"), py::arg("id"), py::arg("text"), py::arg("timestamp"), py::arg("vector"),
         py::arg("sources") = py::tuple(), py::arg("replay") = false)
      .def("delete", [](State& s, RecordSink* sink, py::handle id) { s.remove(sink, as_id(id)); })
      .def("noop", &State::noop)
      .def("set_base", [](State& s, py::array vectors, py::list rows, int64_t next_id, int64_t lsn) {
        s.set_base(make_base(vectors, rows, s.dim()), next_id, lsn);
      })
      .def("get", [](const State& s, py::handle id) -> py::object {
        const Record* r = s.get(as_id(id));
        return r ? record_tuple(r) : py::none();
      })
      .def("contains", [](const State& s, py::handle id) {  // `x in bank` is False for anything not an id
        PyObject* o = id.ptr();
        if (PyBool_Check(o) || !PyIndex_Check(o)) return false;
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return false; }
        return !overflow && s.get(v) != nullptr;
      })
      // Top-k over the delta and the base: every base row when `base_rows` is None, else those rows plus
      // `count` live candidates from each of `graphs` (HNSW), all re-scored exactly.
      .def("search", [](const State& s, py::handle q, int k, py::object speaker, py::object rows,
                        const std::vector<std::shared_ptr<Graph>>& graphs, size_t count) {
        std::vector<float> query = as_vector(q, s.dim());  // a copy: the caller's array may change meanwhile
        if (k < 0) throw BadInput("k must be >= 0, got " + std::to_string(k));
        float inv;
        State::validate_vector(query.data(), s.dim(), &inv);  // a bad query is an error before any search
        int64_t code = -1;
        if (!speaker.is_none()) {
          code = find_speaker(as_str(speaker, "speaker"));
          if (code < 0) return hits_to_arrays({});  // no memory has ever had this speaker
        }
        std::vector<int64_t> cand;
        const bool some = base_rows_arg(rows, !graphs.empty(), "search", cand);
        const size_t work = (some ? cand.size() : size_t(s.base_size())) + size_t(s.delta_len());
        std::vector<Hit> hits;
        if (graphs.empty() && work * size_t(s.dim()) < kReleaseWork) {
          hits = s.search(query.data(), k, code, some ? &cand : nullptr);
        } else {
          State snap = s.fork();  // O(1), made and dropped under the GIL (it changes reference counts)
          py::gil_scoped_release nogil;
          const size_t orphans = cand.size();
          for (const auto& g : graphs) g->search(query.data(), count, snap, cand);
          if (orphans) unique_rows(cand);
          hits = snap.search(query.data(), k, code, some ? &cand : nullptr);
        }
        return hits_to_arrays(hits);
      }, py::arg("query"), py::arg("k"), py::arg("speaker") = py::none(), py::arg("base_rows") = py::none(),
         py::arg("graphs") = std::vector<std::shared_ptr<Graph>>(), py::arg("count") = 0)
      .def("live", [](const State& s) {  // every live row in id order
        py::list out;
        for (const Record* r : s.live()) out.append(record_tuple(r));
        return out;
      })
      // A snapshot's live rows, walked once without the GIL, then read a slice at a time (compaction).
      .def("live_rows", [](const State& s) {
        auto rows = std::make_unique<LiveRows>(s.fork());  // the fork: made under the GIL (reference counts)
        {
          py::gil_scoped_release nogil;
          rows->recs = rows->snap.live();
        }
        return rows;
      })
      // A state whose base is this one's live records over `vectors` (live_rows().vectors(), possibly a
      // copy on disk), no delta, same next id and op count: a compaction's new state, built without the GIL.
      .def("rebased", [](const State& s, py::array vectors) {
        const int dim = s.dim();
        State snap = s.fork();  // made and dropped under the GIL (reference counts)
        if (vectors.dtype().kind() != 'f' || vectors.itemsize() != 4 || vectors.ndim() != 2 ||
            vectors.shape(0) != snap.size() || vectors.shape(1) != dim || !(vectors.flags() & py::array::c_style))
          throw BadInput("rebased: vectors must be a C-contiguous float32 array of shape (live rows, dim)");
        auto keep = std::shared_ptr<void>(new py::object(vectors), [](void* p) {
          py::gil_scoped_acquire gil;
          delete static_cast<py::object*>(p);
        });
        State out(dim, snap.max_text_bytes());
        {
          py::gil_scoped_release nogil;
          auto base = copy_base(snap.live(), static_cast<const float*>(vectors.data()), dim);
          base->keepalive = std::move(keep);
          out.set_base(std::move(base), snap.next_id(), snap.lsn());
        }
        return out;
      }, py::arg("vectors"))
      .def_property_readonly("dim", &State::dim)
      .def_property_readonly("size", &State::size)
      .def_property_readonly("next_id", &State::next_id)
      .def_property_readonly("lsn", &State::lsn)
      .def_property_readonly("delta_len", &State::delta_len)
      .def_property_readonly("base_dead", &State::base_dead)
      .def_property_readonly("base_size", &State::base_size);

  // One search per state (forks of one bank: one base) for the rows of `queries` ([n, dim] float32):
  // exact over the base (State::search_many) when `base_rows` is None,
  // else per query its graphs' `count` live candidates plus `base_rows`, re-scored; all without the GIL.
  // Returns (ids [n, k], scores [n, k], hits [n]): row i holds hits[i] hits, the rest -1 and 0.
  m.def("search_many", [](const std::vector<State*>& states, py::array queries, int k, py::object speaker,
                          py::object rows, const std::vector<std::shared_ptr<Graph>>& graphs, size_t count) {
    if (k < 0) throw BadInput("k must be >= 0, got " + std::to_string(k));
    const size_t n = states.size();
    const int dim = n ? states[0]->dim() : 0;
    if (queries.dtype().kind() != 'f' || queries.itemsize() != 4 || queries.ndim() != 2 ||
        size_t(queries.shape(0)) != n || (n && queries.shape(1) != dim))
      throw BadInput("search_many: queries must be a float32 array of shape (" + std::to_string(n) + ", " +
                     std::to_string(dim) + "), one row per bank");
    std::vector<float> q(n * size_t(dim));  // a copy: the caller's array may change meanwhile
    py::array_t<float, py::array::c_style | py::array::forcecast> contiguous(queries);
    if (!q.empty()) std::memcpy(q.data(), contiguous.data(), sizeof(float) * q.size());
    int64_t code = -1;
    bool unknown_speaker = false;
    if (!speaker.is_none()) {
      code = find_speaker(as_str(speaker, "speaker"));
      unknown_speaker = code < 0;  // no memory has ever had it: every search is empty
    }
    std::vector<int64_t> cand;
    const bool some = base_rows_arg(rows, !graphs.empty(), "search_many", cand);
    std::vector<State> snaps;  // O(1) forks, made and dropped under the GIL (reference counts)
    snaps.reserve(n);
    for (const State* s : states) snaps.push_back(s->fork());
    std::vector<std::vector<Hit>> hits(n);
    {
      py::gil_scoped_release nogil;
      std::vector<const State*> ptrs;
      for (const State& s : snaps) ptrs.push_back(&s);
      if (unknown_speaker) {
        float inv;
        for (size_t i = 0; i < n; ++i) State::validate_vector(q.data() + i * dim, dim, &inv);
      } else if (!some) {
        hits = State::search_many(ptrs, q.data(), k, code);
      } else {
        for (size_t i = 0; i < n; ++i) {
          std::vector<int64_t> c = cand;
          for (const auto& g : graphs) g->search(q.data() + i * dim, count, snaps[i], c);
          if (!cand.empty()) unique_rows(c);
          hits[i] = snaps[i].search(q.data() + i * dim, k, code, &c);
        }
      }
    }
    size_t width = 0;
    for (const auto& h : hits) width = std::max(width, h.size());
    py::array_t<int64_t> ids({py::ssize_t(n), py::ssize_t(width)});
    py::array_t<float> scores({py::ssize_t(n), py::ssize_t(width)});
    py::array_t<int64_t> got{py::ssize_t(n)};
    auto* ip = ids.mutable_data();
    auto* sp = scores.mutable_data();
    for (size_t i = 0; i < n; ++i) {
      got.mutable_data()[i] = int64_t(hits[i].size());
      for (size_t j = 0; j < width; ++j) {
        const bool hit = j < hits[i].size();
        ip[i * width + j] = hit ? hits[i][j].id : -1;
        sp[i * width + j] = hit ? hits[i][j].score : 0.f;
      }
    }
    return py::make_tuple(ids, scores, got);
  }, py::arg("states"), py::arg("queries"), py::arg("k"), py::arg("speaker") = py::none(),
     py::arg("base_rows") = py::none(), py::arg("graphs") = std::vector<std::shared_ptr<Graph>>(), py::arg("count") = 0);
}
