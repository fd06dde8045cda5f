// A speaker's HNSW graph: the file usearch's Python package saved, walked by this module (walk.h) the
// way usearch's own search walks it, so a search never holds the GIL. Builds stay in Python
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

  // For the tests: the `count` nearest keys of the walk (or, `reference`, of usearch's own search of
  // the same bytes with the same distances), leaving out the sorted `excluded` keys.
  std::vector<uint64_t> candidates(const float* q, size_t count, const std::vector<uint64_t>& excluded,
                                   bool reference) const;

  struct Impl;  // graph.cpp: the bytes, usearch's view of them, the walk's layout and its search contexts

 private:
  Graph();
  std::unique_ptr<Impl> impl_;
};

}  // namespace memr1
