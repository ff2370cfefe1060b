#include "train/failure_points.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "comm/forwarding_communicator.h"
#include "ztrain/error.h"

namespace ztrain {

void FailurePoints::reached(std::string_view where) {
  if (fired_ || where != failure_.where || !failure_.applies(step_, rank_)) return;
  fired_ = true;
  const std::string at = " in the " + std::string(where) + " of step " + std::to_string(step_) +
                         " on rank " + std::to_string(rank_) + " (injected by ZTRAIN_TEST_FAIL)";
  // As the device's own error ends: the run appends the strategies to try.
  if (failure_.out_of_memory)
    throw OutOfMemoryError("out of memory" + at + "; pick a strategy that shards or offloads more");
  throw Error("failure" + at);
}

void FailurePoints::warn_if_unreached() const {
  if (fired_ || !failure_.applies(failure_.step, rank_)) return;
  std::fprintf(stderr, "warning: ZTRAIN_TEST_FAIL: this run never reached the %s of step %lld\n",
               failure_.where.c_str(), static_cast<long long>(failure_.step));
}

namespace {

class FailingCommunicator final : public ForwardingCommunicator {
 public:
  FailingCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<FailurePoints> points)
      : ForwardingCommunicator(std::move(inner)), points_(std::move(points)) {}

 private:
  CommWork around(Kind kind, const std::function<CommWork()>& submit) override {
    if (kind == Kind::reduce) points_->reached("reduce");
    if (kind == Kind::gather) points_->reached("gather");
    return submit();
  }
  std::unique_ptr<Communicator> wrap(std::unique_ptr<Communicator> split) override {
    return std::make_unique<FailingCommunicator>(std::move(split), points_);
  }

  std::shared_ptr<FailurePoints> points_;
};

class FailingStrategy final : public Strategy {
 public:
  FailingStrategy(std::shared_ptr<Strategy> inner, std::shared_ptr<FailurePoints> points)
      : s_(std::move(inner)), points_(std::move(points)) {}
  void setup(const StrategySetup& setup) override { s_->setup(setup); }
  void begin_micro_step(bool last) override {
    first_forward_ = first_backward_ = true;
    s_->begin_micro_step(last);
  }
  void before_forward(ModuleId m) override {
    if (std::exchange(first_forward_, false)) points_->reached("forward");
    s_->before_forward(m);
  }
  void after_forward(ModuleId m) override { s_->after_forward(m); }
  void before_backward(ModuleId m) override {
    if (std::exchange(first_backward_, false)) points_->reached("backward");
    s_->before_backward(m);
  }
  void after_backward(ModuleId m) override { s_->after_backward(m); }
  TensorView param_view(ParamId p) override { return s_->param_view(p); }
  TensorView grad_view(ParamId p) override { return s_->grad_view(p); }
  void read_param(ParamId p, float* out) override { s_->read_param(p, out); }
  StepResult step(const StepArgs& args) override {
    points_->reached("optimizer");
    return s_->step(args);
  }
  void save_state(StateSink& sink) override {
    points_->reached("checkpoint");
    s_->save_state(sink);
  }
  void load_state(StateSource& source) override { s_->load_state(source); }
  MemoryEstimate estimate(const EstimateArgs& args) const override { return s_->estimate(args); }
  StrategyStats stats() const override { return s_->stats(); }
  std::string summary() const override { return s_->summary(); }
  bool shards_params() const override { return s_->shards_params(); }
  shard::GatherOptions gather_options() const override { return s_->gather_options(); }

 private:
  std::shared_ptr<Strategy> s_;
  std::shared_ptr<FailurePoints> points_;
  bool first_forward_ = true, first_backward_ = true;
};

}  // namespace

std::unique_ptr<Communicator> with_failure_points(std::unique_ptr<Communicator> comm,
                                                  std::shared_ptr<FailurePoints> points) {
  return std::make_unique<FailingCommunicator>(std::move(comm), std::move(points));
}

std::shared_ptr<Strategy> with_failure_points(std::shared_ptr<Strategy> strategy,
                                              std::shared_ptr<FailurePoints> points) {
  return std::make_shared<FailingStrategy>(std::move(strategy), std::move(points));
}

}  // namespace ztrain
