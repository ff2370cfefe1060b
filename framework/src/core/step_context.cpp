#include <algorithm>

#include "ztrain/error.h"
#include "ztrain/model.h"
#include "ztrain/strategy.h"

namespace ztrain {

void* Arena::take(Tier tier, std::size_t bytes) {
  if (replayed_) return replay(tier, bytes);
  const std::size_t need = aligned(bytes);
  buffers_.push_back(device_.allocate(tier, Category::activations, need, Fill::undefined));
  if (tier == Tier::device) used_ += need;
  return buffers_.back().data();
}

void* Arena::replay(Tier tier, std::size_t bytes) {
  const std::size_t i = (*replayed_)++;
  if (i >= buffers_.size() || buffers_[i].tier() != tier || buffers_[i].bytes() != aligned(bytes))
    throw InternalError("a rewound arena's request " + std::to_string(i + 1) + " (" +
                        std::to_string(aligned(bytes)) + " bytes) is not the one it replays (" +
                        (i < buffers_.size() ? std::to_string(buffers_[i].bytes()) + " bytes"
                                             : "it made only " + std::to_string(buffers_.size())) +
                        "): a backward's plan differs from its forward's");
  return buffers_[i].data();
}

void Arena::reset() {
  buffers_.clear();
  used_ = 0;
  replayed_.reset();
  if (working_) working_->reset();
}

void Arena::rewind() {
  replayed_ = 0;
  if (working_) working_->reset();
}

float* Arena::alloc_working_f32(std::size_t n) {
  return working_ ? working_->alloc_f32(n) : alloc_f32(n);
}

float* Arena::alloc_f32(std::size_t n) {
  return static_cast<float*>(take(Tier::device, n * sizeof(float)));
}

float* Arena::alloc_host_f32(std::size_t n) {
  return static_cast<float*>(take(Tier::host, n * sizeof(float)));
}
const std::int32_t* Arena::on_device(const std::int32_t* host, std::size_t n) {
  if (device_.host_visible(Tier::device)) return host;
  std::int32_t* d = alloc_i32(n);
  device_.copy(d, host, n * sizeof(std::int32_t));
  return d;
}

std::int32_t* Arena::alloc_i32(std::size_t n) {
  return static_cast<std::int32_t*>(take(Tier::device, n * sizeof(std::int32_t)));
}

LossSum::LossSum(Device& device, const Kernels& kernels)
    : device_(device),
      kernels_(kernels),
      // Counted with the gradients, as the step's norm scalars are: the
      // activations category is exactly what one micro-step holds.
      total_(device.allocate(Tier::device, Category::grads, sizeof(double))) {}

void LossSum::add(const float* losses, std::size_t n) {
  kernels_.mean_add(total_.as<double>(), losses, n);
}

double LossSum::take() {
  double total = 0;
  device_.copy(&total, total_.data(), sizeof total);
  device_.fill_zero(total_.data(), sizeof total);
  return total;
}

StepContext::StepContext(Strategy& strategy, const ParamSpecs& params, const Kernels& kernels,
                         Arena& arena, LossSum& losses, float token_scale)
    : strategy_(strategy),
      params_(params),
      kernels_(kernels),
      arena_(arena),
      losses_(losses),
      token_scale_(token_scale) {
  std::size_t modules = 0;
  for (const auto& p : params_)
    for (ModuleId m : p.used_by) modules = std::max(modules, index_of(m) + 1);
  active_.resize(modules);
}

namespace {
void bump(IdVector<ModuleId, int>& active, ModuleId m, int delta) {
  if (static_cast<std::int32_t>(m) < 0)
    throw InternalError("module id " + to_string(m) + " is negative");
  if (!active.contains(m)) active.resize(index_of(m) + 1);
  active[m] += delta;
}
}  // namespace

void StepContext::enter_forward(ModuleId m) {
  strategy_.before_forward(m);
  bump(active_, m, 1);
}
void StepContext::exit_forward(ModuleId m) {
  bump(active_, m, -1);
  strategy_.after_forward(m);
}
void StepContext::enter_backward(ModuleId m) {
  strategy_.before_backward(m);
  bump(active_, m, 1);
}
void StepContext::exit_backward(ModuleId m) {
  bump(active_, m, -1);
  strategy_.after_backward(m);
}

void StepContext::check_usable(ParamId p, const char* what) const {
  if (!params_.contains(p))
    throw InternalError(std::string("model asked for the ") + what + " of parameter id " +
                        to_string(p) + ", which it never declared");
  for (ModuleId m : params_[p].used_by)
    if (active_.contains(m) && active_[m] > 0) return;
  throw InternalError(std::string("model touched the ") + what + " of '" + params_[p].name +
                      "' outside every module that declares it in used_by");
}

TensorView StepContext::param(ParamId p) {
  check_usable(p, "value");
  return strategy_.param_view(p);
}

TensorView StepContext::grad(ParamId p) {
  check_usable(p, "gradient");
  if (!params_[p].trainable) return {};  // frozen: the kernels skip a null gradient
  return strategy_.grad_view(p);
}

void Model::forward_logits(const Batch&, StepContext&, float*) {
  throw Error("model '" + info().arch +
              "' does not offer its logits (Model::forward_logits); compare it on losses instead");
}

std::uint64_t Model::host_activation_bytes(const BatchShape&) const {
  return 0;
}

std::uint64_t Model::kept_activation_bytes(const BatchShape& shape) const {
  return activation_bytes(shape);
}

std::string Model::sequence_shards_refusal(SequenceSplit split) const {
  if (split.shards() <= 1) return {};
  return "model '" + info().arch + "' runs whole sequences only (its plugin does not split them)";
}

std::string Model::segments_refusal() const {
  return "model '" + info().arch +
         "' attends across a whole row (its plugin does not take example boundaries)";
}

std::string Model::split_tensors(const TensorParallel& t) {
  if (t.degree <= 1) return {};
  return "model '" + info().arch + "' runs whole (its plugin does not split its parameters)";
}

std::string Model::split_stages(const std::vector<ModuleRange>& chunks) {
  return "model '" + info().arch + "' runs whole (its plugin does not split its modules into " +
         std::to_string(chunks.size()) + "-chunk pipeline stages)";
}

namespace {

[[noreturn]] void no_stages(const Model& m, const char* what) {
  throw InternalError(std::string("Model::") + what + " called on model '" + m.info().arch +
                      "', which refuses pipeline stages");
}

}  // namespace

std::uint64_t Model::stage_floats(const BatchShape&) const {
  no_stages(*this, "stage_floats");
}

void Model::stage_forward(const Batch&, const StageRun&, StepContext&) {
  no_stages(*this, "stage_forward");
}

void Model::stage_backward(const Batch&, const StageRun&, StepContext&) {
  no_stages(*this, "stage_backward");
}

}  // namespace ztrain
