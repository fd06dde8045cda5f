// The parse of a saved index's bytes into the walk's Layout (walk.h).
#include "walk.h"

#include "core.h"

namespace memr1::walk {

namespace {
uint64_t read_u64(const uint8_t* at, size_t width) {
  uint64_t v = 0;
  std::memcpy(&v, at, width);  // little-endian, as usearch writes it
  return v;
}
}  // namespace

// The layout of an index_dense_t's bytes: the vectors matrix (rows and bytes per row as u32 or u64, then
// the rows), usearch's 64-byte head (its magic first), the graph's header of five u64 (size,
// connectivity, connectivity_base, max_level, entry_slot), a level (i16) per node, then the nodes
// (Layout). Both widths are tried; the one whose magic sits where it should and whose graph size
// matches the rows wins. Every node's links are checked to name a node present at their level, so a
// walk never leaves the bytes.
Layout parse(const uint8_t* data, size_t n, const std::string& what) {
  for (size_t width : {size_t(4), size_t(8)}) {
    if (2 * width > n) break;
    const uint64_t rows = read_u64(data, width), cols = read_u64(data + width, width);
    if (cols == 0 || rows > n || rows * cols / cols != rows) continue;
    const size_t head = 2 * width + rows * cols;
    if (head + 64 + 40 > n || std::memcmp(data + head, "usearch", 7) != 0) continue;
    uint64_t header[5];
    std::memcpy(header, data + head + 64, sizeof(header));
    if (header[0] != rows) continue;
    Layout g;
    g.vectors = data + 2 * width, g.stride = cols, g.size = rows;
    g.links_upper = header[1], g.links_base = header[2], g.max_level = header[3], g.entry = header[4];
    if (rows && (g.entry >= rows || g.links_base > (1u << 20) || g.links_upper > (1u << 20)))
      throw LogFormat(what + ": the graph's header is damaged");
    size_t at = head + 64 + 40 + 2 * rows;
    if (at > n) throw LogFormat(what + ": the graph's levels run past its end");
    const uint8_t* levels = data + head + 64 + 40;
    g.nodes.resize(rows), g.keys.resize(rows);
    for (size_t slot = 0; slot < rows; ++slot) {
      int16_t level;
      std::memcpy(&level, levels + 2 * slot, 2);
      const size_t bytes = 10 + 4 + 4 * g.links_base + size_t(std::max<int16_t>(level, 0)) * (4 + 4 * g.links_upper);
      if (level < 0 || at + bytes > n) throw LogFormat(what + ": node " + std::to_string(slot) + " is damaged");
      g.nodes[slot] = data + at;
      g.keys[slot] = read_u64(data + at, 8);
      if (g.level(uint32_t(slot)) != level) throw LogFormat(what + ": node " + std::to_string(slot) + " is damaged");
      at += bytes;
    }
    // A link at level l must name a node present at level l: a walk reads that node's links there.
    for (size_t slot = 0; slot < rows; ++slot)
      for (int l = 0, top = g.level(uint32_t(slot)); l <= top; ++l) {
        const auto [links, count] = g.links(uint32_t(slot), size_t(l));
        bool bad = count > (l ? g.links_upper : g.links_base);
        for (uint32_t i = 0; !bad && i < count; ++i) {
          const uint32_t next = slot_at(links, i);
          bad = next >= rows || g.level(next) < l;
        }
        if (bad) throw LogFormat(what + ": node " + std::to_string(slot) + " links outside the graph");
      }
    if (rows && g.max_level > size_t(g.level(uint32_t(g.entry))))
      throw LogFormat(what + ": the graph's entry point is below its top level");
    return g;
  }
  throw LogFormat(what + ": cannot find the graph's header");
}

}  // namespace memr1::walk
