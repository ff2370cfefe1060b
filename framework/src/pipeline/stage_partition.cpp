// Modules into pipeline stages.
//
// `parameters` solves the linear partition problem exactly: the least
// bound B on a part's weight that n modules in order can be cut under into
// `parts` non-empty parts. Whether B works is one greedy pass (each part
// takes modules while they fit, so greedy uses the fewest parts any cut
// under B can), and B ranges over integers from the heaviest module to the
// total, so a binary search finds the least. The cut written for it is
// greedy's, stopping a part early only to leave each part after it a
// module; the parts after that point hold one module each, none heavier
// than B, so every part stays under B.
#include <algorithm>
#include <numeric>

#include "ztrain/error.h"
#include "ztrain/pipeline/stage_partition.h"

namespace ztrain::pipeline {
namespace {

std::uint64_t add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum))
    throw ConfigError(
        "the pipeline's module weights sum past 2^64 elements; no model that large can be "
        "partitioned");
  return sum;
}

// The parts greedy cuts under `bound` (every module at most `bound`).
std::size_t greedy_parts(const std::vector<std::uint64_t>& w, std::uint64_t bound) {
  std::size_t parts = 1;
  std::uint64_t load = 0;
  for (const std::uint64_t x : w) {
    if (load + x > bound) {
      ++parts;
      load = 0;
    }
    load += x;
  }
  return parts;
}

std::vector<std::size_t> cut_under(const std::vector<std::uint64_t>& w, std::size_t parts,
                                   std::uint64_t bound) {
  std::vector<std::size_t> bounds{0};
  std::size_t i = 0;
  for (std::size_t p = 0; p + 1 < parts; ++p) {
    std::uint64_t load = w[i++];
    while (w.size() - i > parts - p - 1 && load + w[i] <= bound) load += w[i++];
    bounds.push_back(i);
  }
  bounds.push_back(w.size());
  return bounds;
}

std::vector<std::size_t> balanced(const std::vector<std::uint64_t>& w, std::size_t parts) {
  std::uint64_t lo = *std::max_element(w.begin(), w.end()), hi = 0;
  for (const std::uint64_t x : w) hi = add(hi, x);
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    if (greedy_parts(w, mid) <= parts)
      hi = mid;
    else
      lo = mid + 1;
  }
  return cut_under(w, parts, lo);
}

std::vector<std::size_t> uniform(std::size_t n, std::size_t parts) {
  std::vector<std::size_t> bounds{0};
  const std::size_t each = n / parts, extra = n % parts;
  for (std::size_t p = 0; p < parts; ++p) bounds.push_back(bounds.back() + each + (p < extra));
  return bounds;
}

}  // namespace

PartitionMethod partition_method(std::string_view name) {
  if (name == "uniform") return PartitionMethod::uniform;
  if (name == "parameters") return PartitionMethod::parameters;
  throw ConfigError("pipeline partition method \"" + std::string(name) +
                    "\" is not built in; choose \"uniform\" (as many modules a stage) or "
                    "\"parameters\" (as many parameters a stage)");
}

std::vector<std::uint64_t> module_weights(const ParamSpecs& params, std::size_t modules) {
  std::vector<std::uint64_t> w(modules, 0);
  for (const ParamSpec& p : params)
    for (const ModuleId m : p.used_by) {
      const std::size_t i = index_of(m);
      if (i >= modules)
        throw InternalError("parameter " + p.name + " is used by module " + std::to_string(i) +
                            " of " + std::to_string(modules));
      w[i] = add(w[i], static_cast<std::uint64_t>(p.shape.numel()));
    }
  return w;
}

std::vector<std::size_t> partition_modules(const std::vector<std::uint64_t>& weights,
                                           std::size_t parts, PartitionMethod method) {
  if (parts < 1) throw InternalError("partition_modules: no parts");
  if (weights.size() < parts)
    throw ConfigError("the pipeline has " + std::to_string(parts) +
                      " (virtual) stages but the model " + std::to_string(weights.size()) +
                      " modules (its embedding, blocks and head), so a stage would run nothing; "
                      "lower [parallel] pipeline or the chunks a stage");
  return method == PartitionMethod::uniform ? uniform(weights.size(), parts)
                                            : balanced(weights, parts);
}

std::vector<ModuleRange> stage_chunks(const std::vector<std::size_t>& bounds, std::size_t stages,
                                      std::size_t stage) {
  if (stages == 0 || bounds.empty() || (bounds.size() - 1) % stages != 0 || stage >= stages)
    throw InternalError("stage_chunks: " + std::to_string(bounds.size() - 1) +
                        " virtual stages do not make chunks of stage " + std::to_string(stage) +
                        " of " + std::to_string(stages));
  std::vector<ModuleRange> chunks;
  for (std::size_t v = stage; v + 1 < bounds.size(); v += stages)
    chunks.push_back({bounds[v], bounds[v + 1]});
  return chunks;
}

std::vector<std::size_t> stages_holding(const ParamSpec& param,
                                        const std::vector<std::size_t>& bounds,
                                        std::size_t stages) {
  // Virtual stage v (the one whose bounds hold the module) is chunk
  // v / stages of stage v % stages.
  std::vector<std::size_t> out;
  for (const ModuleId m : param.used_by) {
    const auto above = std::upper_bound(bounds.begin(), bounds.end(), index_of(m));
    if (above == bounds.begin() || above == bounds.end())
      throw InternalError("stages_holding: module " + to_string(m) + " is outside the " +
                          std::to_string(bounds.empty() ? 0 : bounds.back()) + " modules cut");
    out.push_back(static_cast<std::size_t>(above - bounds.begin() - 1) % stages);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace ztrain::pipeline
