#include "job/mesh_plan.h"

#include <cstdint>

#include "ztrain/error.h"

namespace ztrain {
namespace {

constexpr const char* kNames[kMeshDims] = {"tensor", "sequence", "context", "data", "pipeline"};

int index(MeshDim d) {
  return static_cast<int>(d);
}

void check_degree(const char* key, int degree) {
  if (degree < 1)
    throw ConfigError("[parallel] " + std::string(key) + " is " + std::to_string(degree) +
                      "; give 1 (no split) or more ranks");
}

// Tensor and sequence groups are runs of tensor x sequence consecutive
// ranks from rank 0: each host's count of ranks must be a multiple, so
// that no run straddles two hosts.
void check_hosts(const ParallelSettings& d, const MeshHosts& hosts) {
  const int inner = d.tensor * d.sequence;
  for (std::size_t h = 0; h < hosts.ranks.size(); ++h)
    if (hosts.ranks[h] % inner != 0)
      throw ConfigError("[parallel] tensor x sequence = " + std::to_string(d.tensor) + " x " +
                        std::to_string(d.sequence) + " = " + std::to_string(inner) +
                        " ranks must share a host, but host " + std::to_string(h) + " runs " +
                        std::to_string(hosts.ranks[h]) +
                        " ranks; give each host a multiple of that many ranks, or lower "
                        "tensor or sequence (context may span hosts)");
}

}  // namespace

int MeshPlan::coordinate(int rank, MeshDim d) const {
  return rank / stride_[index(d)] % size_[index(d)];
}

std::vector<int> MeshPlan::group(int rank, MeshDim d) const {
  const int base = rank - coordinate(rank, d) * stride_[index(d)];
  std::vector<int> ranks;
  for (int i = 0; i < size_[index(d)]; ++i) ranks.push_back(base + i * stride_[index(d)]);
  return ranks;
}

std::string MeshPlan::describe() const {
  std::string out;
  for (int i = 0; i < kMeshDims; ++i)
    if (size_[i] > 1)
      out += (out.empty() ? "" : " x ") + std::string(kNames[i]) + " " + std::to_string(size_[i]);
  return out.empty() ? "data 1" : out;
}

namespace {

// "0-3" for consecutive ranks, "0,2,4" otherwise.
std::string ranks_text(const std::vector<int>& ranks) {
  bool consecutive = true;
  for (std::size_t i = 1; i < ranks.size(); ++i) consecutive &= ranks[i] == ranks[i - 1] + 1;
  if (consecutive && ranks.size() > 1)
    return std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
  std::string out;
  for (const int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

}  // namespace

std::string MeshPlan::describe_groups(MeshDim d) const {
  constexpr int kShown = 4;
  const int groups = world_ / size(d);
  std::string out;
  std::vector<bool> listed(static_cast<std::size_t>(world_), false);
  int shown = 0;
  for (int r = 0; r < world_ && shown < kShown; ++r) {
    if (listed[static_cast<std::size_t>(r)]) continue;
    const std::vector<int> members = group(r, d);
    for (const int m : members) listed[static_cast<std::size_t>(m)] = true;
    out += (out.empty() ? "" : " | ") + ranks_text(members);
    ++shown;
  }
  if (groups > kShown) out += " | ... (" + std::to_string(groups) + " groups)";
  return out;
}

MeshPlan plan_mesh(const ParallelSettings& degrees, const MeshHosts& hosts) {
  check_degree("tensor", degrees.tensor);
  check_degree("sequence", degrees.sequence);
  check_degree("context", degrees.context);
  check_degree("pipeline", degrees.pipeline);
  std::int64_t world = 0;
  for (const int n : hosts.ranks) {
    if (n < 1) throw InternalError("plan_mesh: a host with no ranks");
    world += n;
  }
  if (world < 1) throw InternalError("plan_mesh: no hosts");
  // Degrees up to 2^31 each: their product fits in 128 bits, not 64; stop
  // as soon as it passes the world.
  std::int64_t split = 1;
  for (const int d : {degrees.tensor, degrees.sequence, degrees.context, degrees.pipeline}) {
    split *= d;
    if (split > world) break;
  }
  if (split > world || world % split != 0)
    throw ConfigError(
        "[parallel] tensor x sequence x context x pipeline = " + std::to_string(degrees.tensor) +
        " x " + std::to_string(degrees.sequence) + " x " + std::to_string(degrees.context) + " x " +
        std::to_string(degrees.pipeline) + " does not divide the job's " + std::to_string(world) +
        " ranks (the data-parallel degree is what they leave); choose degrees "
        "whose product divides the ranks");
  check_hosts(degrees, hosts);
  MeshPlan plan;
  plan.world_ = static_cast<int>(world);
  plan.size_ = {degrees.tensor, degrees.sequence, degrees.context, static_cast<int>(world / split),
                degrees.pipeline};
  for (int i = 1; i < kMeshDims; ++i) plan.stride_[i] = plan.stride_[i - 1] * plan.size_[i - 1];
  return plan;
}

}  // namespace ztrain
