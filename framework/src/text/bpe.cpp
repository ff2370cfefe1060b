#include "text/bpe.h"

#include <cstdio>
#include <queue>

#include "text/utf8.h"
#include "ztrain/error.h"

namespace ztrain::text {

BpeModel::BpeModel(std::unordered_map<std::string, std::int32_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options, const std::string& where)
    : vocab_(std::move(vocab)), options_(options) {
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto ia = vocab_.find(a), ib = vocab_.find(b), ir = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || ir == vocab_.end())
      throw ConfigError(where + ": model.merges[" + std::to_string(rank) + "] (\"" + a + "\", \"" +
                        b + "\") names a token the vocabulary lacks");
    merges_.emplace(pair_key(ia->second, ib->second),
                    Merge{static_cast<std::uint32_t>(rank), ir->second});
  }
}

std::optional<std::int32_t> BpeModel::id(const std::string& token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? std::nullopt : std::optional(it->second);
}

void BpeModel::initial_symbols(std::string_view word, std::vector<std::int32_t>& ids) const {
  bool last_unk = false;
  for (std::size_t at = 0; at < word.size();) {
    const std::size_t len = utf8_length(word, at);
    const std::string ch(word.substr(at, len));
    at += len;
    if (const auto it = vocab_.find(ch); it != vocab_.end()) {
      ids.push_back(it->second);
      last_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      std::vector<std::int32_t> bytes;
      for (const unsigned char c : ch) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", c);
        const auto b = vocab_.find(name);
        if (b == vocab_.end()) break;
        bytes.push_back(b->second);
      }
      if (bytes.size() == ch.size()) {
        ids.insert(ids.end(), bytes.begin(), bytes.end());
        last_unk = false;
        continue;
      }
    }
    if (!options_.unk) continue;
    if (!(options_.fuse_unk && last_unk)) ids.push_back(*options_.unk);
    last_unk = true;
  }
}

// Symbols form a linked list over `ids`; a queue holds each adjacent pair
// that has a merge, by (rank, position). An entry whose left symbol has
// since been merged away, or whose right neighbour changed, is stale and
// skipped: the pair it names no longer exists.
void BpeModel::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (options_.ignore_merges)
    if (const auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  std::vector<std::int32_t> ids;
  initial_symbols(word, ids);
  const std::size_t n = ids.size();
  std::vector<std::int64_t> prev(n), next(n);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<std::int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<std::int64_t>(i + 1) : -1;
  }
  struct Entry {
    std::uint32_t rank;
    std::size_t pos;
    std::int32_t right;  // the right symbol's id when queued
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
  const auto push = [&](std::size_t left) {
    if (next[left] < 0) return;
    const auto right = static_cast<std::size_t>(next[left]);
    if (const auto m = merges_.find(pair_key(ids[left], ids[right])); m != merges_.end())
      queue.push({m->second.rank, left, ids[right]});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> gone(n, false);
  while (!queue.empty()) {
    const Entry e = queue.top();
    queue.pop();
    if (gone[e.pos] || next[e.pos] < 0) continue;
    const auto right = static_cast<std::size_t>(next[e.pos]);
    if (ids[right] != e.right) continue;
    const auto m = merges_.find(pair_key(ids[e.pos], ids[right]));
    if (m == merges_.end() || m->second.rank != e.rank) continue;
    ids[e.pos] = m->second.result;
    gone[right] = true;
    next[e.pos] = next[right];
    if (next[right] >= 0)
      prev[static_cast<std::size_t>(next[right])] = static_cast<std::int64_t>(e.pos);
    if (prev[e.pos] >= 0) push(static_cast<std::size_t>(prev[e.pos]));
    push(e.pos);
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!gone[i]) out.push_back(ids[i]);
}

}  // namespace ztrain::text
