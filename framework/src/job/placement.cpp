#include "job/placement.h"

#include <cstdlib>

#include "comm/world.h"
#include "core/host_name.h"
#include "job/rank_agreement.h"

namespace ztrain {
namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    parts.push_back(text.substr(at, comma - at));
    at = comma + 1;
  }
  return parts;
}

std::string joined(const std::vector<std::string>& parts, const char* sep) {
  std::string text;
  for (const std::string& p : parts) text += (text.empty() ? "" : sep) + p;
  return text;
}

}  // namespace

RankPlace this_rank_place(bool cuda) {
  const auto local = static_cast<std::size_t>(local_rank());
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!visible) return {host_name(), cuda ? std::to_string(local) : ""};
  const std::vector<std::string> ids = split_commas(visible);
  return {host_name(), local < ids.size() ? ids[local] : "none of " + std::string(visible)};
}

// Groups consecutive ranks of one host; each group lists its ranks' GPUs in
// rank order, so "rank r has GPU g" reads off by position.
std::string placement_text(const std::vector<RankPlace>& ranks, bool cuda) {
  std::vector<std::string> groups;
  for (std::size_t first = 0; first < ranks.size();) {
    std::size_t last = first;
    while (last + 1 < ranks.size() && ranks[last + 1].host == ranks[first].host) ++last;
    std::vector<std::string> gpus;
    for (std::size_t r = first; r <= last; ++r)
      if (!ranks[r].gpu.empty()) gpus.push_back(ranks[r].gpu);
    std::string group = first == last
                            ? "rank " + std::to_string(first)
                            : "ranks " + std::to_string(first) + "-" + std::to_string(last);
    group += " on host " + ranks[first].host + ": ";
    if (cuda)
      group += "GPU " + joined(gpus, ", ");
    else
      group += gpus.empty() ? "cpu" : "cpu (GPU slots " + joined(gpus, ", ") + " given, unused)";
    groups.push_back(group);
    first = last + 1;
  }
  return joined(groups, " | ");
}

std::vector<RankPlace> gather_places(bool cuda, Communicator& comm) {
  const RankPlace mine = this_rank_place(cuda);
  std::vector<RankPlace> ranks;
  for (const std::string& text : every_rank_text(mine.host + '\n' + mine.gpu, comm)) {
    const std::size_t cut = text.find('\n');
    ranks.push_back({text.substr(0, cut), text.substr(cut + 1)});
  }
  return ranks;
}

MeshHosts mesh_hosts(const std::vector<RankPlace>& ranks) {
  MeshHosts hosts;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    if (r == 0 || ranks[r].host != ranks[r - 1].host)
      hosts.ranks.push_back(1);
    else
      ++hosts.ranks.back();
  return hosts;
}

}  // namespace ztrain
