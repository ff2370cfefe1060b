// The digest is FNV-1a over the sorted "key = value" lines of the merged
// configuration (origins left out: the same value from a file on one rank
// and from --set on another agrees). Digests are all-gathered first; only
// when they differ do the ranks all-gather the lines themselves (with
// origins), so each rank finds the same first differing key and raises
// the same error. Both travel as the bits of fp32 elements, which an
// all-gather copies untouched.
#include "train/config_agreement.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ztrain/error.h"

namespace ztrain {
namespace {

struct Setting {
  std::string value, origin;
};
using Settings = std::map<std::string, Setting>;

void flatten(const RunConfig& config, const toml::table& t, const std::string& prefix,
             Settings& out) {
  for (const auto& [key, node] : t) {
    const std::string path =
        prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    if (const auto* sub = node.as_table()) {
      flatten(config, *sub, path, out);
      continue;
    }
    std::ostringstream value;
    node.visit([&](const auto& v) { value << v; });
    out[path] = {value.str(), config.where(path)};
  }
}

std::uint64_t digest(const Settings& s) {
  std::uint64_t h = 1469598103934665603ull;
  const auto mix = [&](const std::string& text) {
    for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // separator
  };
  for (const auto& [key, setting] : s) {
    mix(key);
    mix(setting.value);
  }
  return h;
}

// One line per key: key, value and origin separated by \x1f.
std::string encode(const Settings& s) {
  std::string text;
  for (const auto& [key, setting] : s)
    text += key + '\x1f' + setting.value + '\x1f' + setting.origin + '\n';
  return text;
}

Settings decode(const std::string& text) {
  Settings s;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto a = line.find('\x1f'), b = line.find('\x1f', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    s[line.substr(0, a)] = {line.substr(a + 1, b - a - 1), line.substr(b + 1)};
  }
  return s;
}

// Every rank's text, through an all-gather of fp32 elements.
std::vector<std::string> gather_texts(const std::string& mine, Communicator& comm) {
  const auto world = static_cast<std::size_t>(comm.size());
  std::vector<float> lengths(world);
  const auto length = static_cast<float>(mine.size());  // exact below 2^24
  comm.all_gather_async(&length, lengths.data(), 1, DType::f32).wait();
  std::vector<std::size_t> counts(world);
  std::size_t total = 0;
  for (std::size_t r = 0; r < world; ++r) {
    counts[r] = (static_cast<std::size_t>(lengths[r]) + 3) / 4;
    total += counts[r];
  }
  std::vector<float> send(counts[static_cast<std::size_t>(comm.rank())], 0.0f), all(total);
  std::memcpy(send.data(), mine.data(), mine.size());
  comm.all_gather_v_async(send.data(), all.data(), counts, DType::f32).wait();
  std::vector<std::string> texts;
  std::size_t at = 0;
  for (std::size_t r = 0; r < world; ++r) {
    texts.emplace_back(reinterpret_cast<const char*>(all.data() + at),
                       static_cast<std::size_t>(lengths[r]));
    at += counts[r];
  }
  return texts;
}

std::string describe(const Settings& s, const std::string& key) {
  const auto it = s.find(key);
  if (it == s.end()) return "absent";
  return it->second.value + (it->second.origin.empty() ? "" : " (" + it->second.origin + ")");
}

}  // namespace

void check_ranks_agree(const RunConfig& config, Communicator& comm) {
  if (comm.size() == 1) return;
  Settings mine;
  flatten(config, config.table(), "", mine);
  const std::uint64_t h = digest(mine);
  float packed[2];
  std::memcpy(packed, &h, sizeof h);
  std::vector<float> all(2 * static_cast<std::size_t>(comm.size()));
  comm.all_gather_async(packed, all.data(), 2, DType::f32).wait();
  std::vector<std::uint64_t> digests(static_cast<std::size_t>(comm.size()));
  std::memcpy(digests.data(), all.data(), all.size() * sizeof(float));
  std::size_t other = 0;
  for (std::size_t r = 1; r < digests.size() && !other; ++r)
    if (digests[r] != digests[0]) other = r;
  if (!other) return;
  const auto texts = gather_texts(encode(mine), comm);
  const Settings first = decode(texts[0]), theirs = decode(texts[other]);
  // Plugin choices first: a different strategy differs in all its keys.
  std::vector<std::string> keys;
  for (const Settings* s : {&first, &theirs})
    for (const auto& [k, v] : *s) keys.push_back(k);
  std::stable_sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) {
    const auto plugin = [](const std::string& k) { return k.ends_with(".plugin"); };
    return plugin(a) && !plugin(b);
  });
  for (const auto& key : keys) {
    const auto a = first.find(key), b = theirs.find(key);
    if (a != first.end() && b != theirs.end() && a->second.value == b->second.value) continue;
    throw ConfigError("the ranks disagree on the configuration: " + key + " is " +
                      describe(first, key) + " on rank 0 but " + describe(theirs, key) +
                      " on rank " + std::to_string(other) +
                      "; start every rank with the same run file, presets and --set overrides");
  }
  throw ConfigError("the ranks disagree on the configuration (rank 0 and rank " +
                    std::to_string(other) +
                    " differ in a way no key shows); start every rank "
                    "with the same run file, presets and --set overrides");
}

bool any_rank(bool mine, Communicator& comm) {
  float count = mine ? 1.0f : 0.0f;
  if (comm.size() > 1) comm.all_reduce_async(&count, 1, DType::f32, ReduceOp::sum).wait();
  return count != 0.0f;
}

}  // namespace ztrain
