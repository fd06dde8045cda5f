// The walk a graph search takes (graph.h): usearch's HNSW search, step for step, over the saved file's
// bytes. A greedy descent through the upper levels from the entry point, then a beam search of the base
// level: the same visiting order, the same candidate queues (usearch's own heap and sorted buffer, so
// ties break the same way) and the same stopping rule as usearch's index_gt::search, so with the same
// distances it returns the same keys (tests/test_bank_threads.py checks this against usearch's own
// search). What differs is the cost per step: the visited set is a stamp per node instead of a hash
// set, neighbours' vectors are prefetched before their distances are taken, and the distance is a
// functor the compiler inlines (cosine_i8.h for the bank's i8 graphs).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <usearch/index_plugins.hpp>  // usearch's heaps and aligned allocator

namespace memr1::walk {

namespace us = unum::usearch;

// Where a saved index's nodes and vectors lie (graph.cpp parses and checks it). A node's tape: its key
// (u64), its level (i16), the base level's links (a u32 count, then `links_base` u32 slots), then each
// upper level's (a u32 count, then `links_upper` slots).
struct Layout;
// The layout of `n` bytes of a saved index_dense_t, every link checked (LogFormat naming `what` if not).
Layout parse(const uint8_t* data, size_t n, const std::string& what);

struct Layout {
  const uint8_t* vectors = nullptr;  // slot s's vector at vectors + s * stride
  size_t stride = 0, size = 0, max_level = 0, entry = 0;
  size_t links_base = 0, links_upper = 0;
  std::vector<const uint8_t*> nodes;  // slot -> its tape
  std::vector<uint64_t> keys;         // slot -> key (the free key for a removed node)

  const uint8_t* vector(uint32_t slot) const { return vectors + size_t(slot) * stride; }
  int level(uint32_t slot) const {
    int16_t l;
    std::memcpy(&l, nodes[slot] + 8, 2);
    return l;
  }
  // (first slot, count) of a node's links at `level` (<= its own level)
  std::pair<const uint8_t*, uint32_t> links(uint32_t slot, size_t level) const {
    const uint8_t* at = nodes[slot] + 10 + (level ? 4 + 4 * links_base + (level - 1) * (4 + 4 * links_upper) : 0);
    uint32_t count;
    std::memcpy(&count, at, 4);
    return {at + 4, count};
  }
  void prefetch(uint32_t slot) const {  // its vector
    const uint8_t* v = vector(slot);
    for (size_t off = 0; off < stride; off += 64) __builtin_prefetch(v + off);
  }
  void prefetch_links(uint32_t slot) const {  // its base level's links (what popping it reads)
    const uint8_t* at = nodes[slot];
    for (size_t off = 0; off < 14 + 4 * links_base; off += 64) __builtin_prefetch(at + off);
  }
};

inline uint32_t slot_at(const uint8_t* links, uint32_t i) {
  uint32_t s;
  std::memcpy(&s, links + 4 * i, 4);
  return s;
}

struct Candidate {  // usearch's candidate_t
  float distance;
  uint32_t slot;
  bool operator<(Candidate other) const noexcept { return distance < other.distance; }
};
using Alloc = us::aligned_allocator_gt<Candidate, 64>;

// One thread's walk state, reused from search to search.
struct Scratch {
  us::max_heap_gt<Candidate, std::less<Candidate>, Alloc> next;     // usearch: pop the nearest next
  us::sorted_buffer_gt<Candidate, std::less<Candidate>, Alloc> top;  // the best `expansion` so far
  std::vector<uint8_t> seen;  // slot -> the walk that visited it last (mod 255: a byte keeps it in cache)
  uint8_t epoch = 0;

  void begin(size_t n) {
    if (seen.size() != n) seen.assign(n, 0), epoch = 0;
    if (++epoch == 0) std::fill(seen.begin(), seen.end(), 0), epoch = 1;
  }
  bool visited(uint32_t s) const { return seen[s] == epoch; }
  bool visit(uint32_t s) {  // true when already visited, as usearch's visits.set
    if (seen[s] == epoch) return true;
    seen[s] = epoch;
    return false;
  }
};

// The `wanted` nearest slots among those `allow(slot)` admits, nearest first, left in s.top (a beam of
// max(expansion, wanted)). `distance(slot)`: the query's distance to that node.
template <class Distance, class Allow>
void search(const Layout& g, Scratch& s, size_t wanted, size_t expansion, Distance&& distance, Allow&& allow) {
  s.top.clear();
  s.next.clear();
  if (!g.size || !wanted) return;
  const size_t limit = std::max(expansion, wanted);
  if (!s.next.reserve(limit) || !s.top.reserve(limit)) throw std::bad_alloc();

  uint32_t closest = static_cast<uint32_t>(g.entry);
  float closest_distance = distance(closest);
  for (size_t level = g.max_level; level > 0; --level) {
    bool changed;
    do {
      changed = false;
      const auto [links, count] = g.links(closest, level);
      for (uint32_t i = 0; i < count; ++i) {
        const uint32_t slot = slot_at(links, i);
        const float d = distance(slot);
        if (d < closest_distance) closest_distance = d, closest = slot, changed = true;
      }
    } while (changed);
  }

  s.begin(g.size);
  float radius = closest_distance;
  s.next.insert_reserved({-radius, closest});
  s.visit(closest);
  if (allow(closest)) s.top.insert_reserved({radius, closest});
  while (!s.next.empty()) {
    const Candidate candidate = s.next.top();
    if (-candidate.distance > radius && s.top.size() == limit) break;
    s.next.pop();
    const auto [links, count] = g.links(candidate.slot, 0);
    for (uint32_t i = 0; i < count; ++i)
      if (!s.visited(slot_at(links, i))) g.prefetch(slot_at(links, i));
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t slot = slot_at(links, i);
      if (s.visit(slot)) continue;
      const float d = distance(slot);
      if (s.top.size() < limit || d < radius) {
        g.prefetch_links(slot);
        s.next.insert({-d, slot});
        if (allow(slot)) {
          s.top.insert({d, slot}, limit);
          radius = s.top.top().distance;
        }
      }
    }
  }
  s.top.shrink(wanted);
}

}  // namespace memr1::walk
