#include "job/stage_links.h"

#include <algorithm>

#include "ztrain/error.h"

namespace ztrain {
namespace {

// The members of a group split from the pipeline group, in key order; the
// others each get a group of one, dropped at once.
std::unique_ptr<Communicator> group_of(Communicator& pipeline,
                                       const std::vector<std::size_t>& members) {
  const auto me = static_cast<std::size_t>(pipeline.rank());
  const auto at = std::find(members.begin(), members.end(), me);
  if (at == members.end()) {
    pipeline.split(1 + pipeline.rank(), 0);
    return nullptr;
  }
  return pipeline.split(0, static_cast<int>(at - members.begin()));
}

}  // namespace

// Every stage splits once per possible link, in the same order: the
// activation link from stage e, then the gradient link from stage e, for
// e = 0 .. P - 1. The sender is the link's rank 0.
StageLinks::StageLinks(Communicator& pipeline, bool wraps,
                       const std::vector<std::vector<std::size_t>>& tied_sets) {
  const auto P = static_cast<std::size_t>(pipeline.size());
  const auto me = static_cast<std::size_t>(pipeline.rank());
  for (std::size_t e = 0; e < P; ++e) {
    const std::size_t next = (e + 1) % P, previous = (e + P - 1) % P;
    if (e + 1 < P || wraps)
      if (auto link = group_of(pipeline, {e, next}))
        (me == e ? activation_out_ : activation_in_) = std::move(link);
    if (e > 0 || wraps)
      if (auto link = group_of(pipeline, {e, previous}))
        (me == e ? gradient_out_ : gradient_in_) = std::move(link);
  }
  for (const std::vector<std::size_t>& set : tied_sets) tied_.push_back(group_of(pipeline, set));
}

namespace {

Communicator& link(const std::unique_ptr<Communicator>& c, const char* what) {
  if (!c) throw InternalError(std::string("a pipeline stage has no link to ") + what);
  return *c;
}

}  // namespace

CommWork StageLinks::send_activation(const float* data, std::size_t n) {
  // The root's buffer is only read.
  return link(activation_out_, "send activations over")
      .broadcast_async(const_cast<float*>(data), n, DType::f32, 0);
}

void StageLinks::recv_activation(float* data, std::size_t n) {
  link(activation_in_, "receive activations over").broadcast(data, n, DType::f32, 0);
}

CommWork StageLinks::send_gradient(const float* data, std::size_t n) {
  return link(gradient_out_, "send gradients over")
      .broadcast_async(const_cast<float*>(data), n, DType::f32, 0);
}

void StageLinks::recv_gradient(float* data, std::size_t n) {
  link(gradient_in_, "receive gradients over").broadcast(data, n, DType::f32, 0);
}

void check_stages_agree(Communicator& pipeline, std::uint64_t fingerprint,
                        const std::string& what) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(pipeline.size()));
  // Eight bytes a stage, moved as two fp32 elements (copied, never read).
  pipeline.all_gather(&fingerprint, all.data(), 2, DType::f32);
  for (std::size_t s = 0; s + 1 < all.size(); ++s)
    if (all[s] != all[s + 1])
      throw ConfigError("pipeline stages " + std::to_string(s) + " and " + std::to_string(s + 1) +
                        " disagree on " + what + " (fingerprints " + std::to_string(all[s]) +
                        " and " + std::to_string(all[s + 1]) +
                        "): every rank must run the same configuration and build");
}

}  // namespace ztrain
