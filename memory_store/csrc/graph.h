// A speaker's HNSW graph, searched by usearch's own C++ core (header-only, compiled into this module)
// on the file usearch's Python package saved, so a search never holds the GIL. Builds stay in Python
// (memory_store/graph.py builds, checks and repairs each graph); this side only reads it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace memr1 {

class State;

class Graph {
 public:
  // The saved index at `path`, memory-mapped (a segment's hnsw-<i>.usearch, never written again).
  // `beam`: the search's expansion (usearch's file does not keep it).
  static std::shared_ptr<Graph> view(const std::string& path, size_t beam);
  // An index serialized to bytes (an in-memory segment's), loaded into memory owned by the graph.
  static std::shared_ptr<Graph> load(const uint8_t* data, size_t n, size_t beam);
  ~Graph();

  size_t size() const;
  size_t dim() const;
  size_t expansion() const;
  // Appends to `out` base rows (the graph's keys) nearest `q`, best first, among which `count` are live
  // in `state` when it has that many: a plain walk for a few more candidates when the state holds few
  // dead base rows (at most `count`) or a small share of them (checked; the dead ones are skipped when
  // re-scored), else a filtered walk that skips rows it holds deleted or superseded. Thread-safe: each
  // concurrent search takes one of the per-thread contexts.
  void search(const float* q, size_t count, const State& state, std::vector<int64_t>& out) const;
  // The keys of the live nodes that a walk along links of every level from the entry point does not
  // reach: rows no search can return (a search only ever moves along such links). Removed nodes
  // (usearch keeps them as tombstones) are not walked through, so a row reached only through one
  // counts as unreachable (the safe side).
  std::vector<uint64_t> unreachable() const;

  // The i8 cosine distance of a and b (`dim` bytes each) by every kernel this CPU runs, named
  // ("scalar", "avx2", "avx512_vnni"): the walk uses the last; tests check that all agree to the bit.
  static std::vector<std::pair<std::string, float>> cos_i8_kernels(const int8_t* a, const int8_t* b, size_t dim);

  struct Impl;  // graph.cpp: the usearch index and its pool of search contexts

 private:
  Graph();
  std::unique_ptr<Impl> impl_;
};

}  // namespace memr1
