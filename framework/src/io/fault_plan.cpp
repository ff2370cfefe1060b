#include "io/fault_plan.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/hold_points.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

const char* variable(const char* name) {
  const char* text = std::getenv(name);
  return text && *text ? text : nullptr;
}

[[noreturn]] void refuse(const char* name, const char* text, const char* expected) {
  throw ConfigError(std::string(name) + "=" + text + ": expected " + expected);
}

bool known_start_phase(const std::string& phase) {
  for (const char* p : {"store", "beats", "met", "published", "mpi_init", "connected"})
    if (phase == p) return true;
  return false;
}

InjectedFailure injected_failure(const char* text) {
  const char* expected =
      "WHERE:KIND:STEP or WHERE:KIND:STEP:RANK, WHERE one of forward, backward, reduce, gather, "
      "optimizer, checkpoint and KIND oom or error, e.g. reduce:oom:2:1";
  char where[16] = {}, kind[8] = {};
  long long step = 0;
  int rank = -1, used = 0;
  const int n =
      std::sscanf(text, "%15[a-z]:%7[a-z]:%lld%n:%d%n", where, kind, &step, &used, &rank, &used);
  const std::string k = kind;
  InjectedFailure f{where, k == "oom", step, n == 4 ? rank : -1};
  bool known = false;
  for (const char* w : {"forward", "backward", "reduce", "gather", "optimizer", "checkpoint"})
    known = known || f.where == w;
  if (n < 3 || text[used] != '\0' || !known || (k != "oom" && k != "error") || step < 1 ||
      (n == 4 && rank < 0))
    refuse("ZTRAIN_TEST_FAIL", text, expected);
  return f;
}

// POINT:SECONDS[,POINT:SECONDS...], each point once.
std::map<std::string, double> holds_of(const char* text) {
  const auto& names = hold_point_names();
  std::string points;
  for (const auto& name : names) points += (points.empty() ? "" : ", ") + name;
  const std::string expected = "POINT:SECONDS[,POINT:SECONDS...], POINT one of " + points +
                               " and SECONDS above 0 and at most 600, e.g. checkpoint_located:3";
  std::map<std::string, double> holds;
  const std::string all = text;
  for (std::size_t at = 0; at <= all.size();) {
    const std::size_t end = std::min(all.find(',', at), all.size());
    const std::string item = all.substr(at, end - at);
    const std::size_t colon = item.find(':');
    double s = 0;
    int used = 0;
    const std::string point = item.substr(0, colon);
    if (colon == std::string::npos || std::find(names.begin(), names.end(), point) == names.end() ||
        holds.count(point) || std::sscanf(item.c_str() + colon + 1, "%lf%n", &s, &used) != 1 ||
        colon + 1 + static_cast<std::size_t>(used) != item.size() || !(s > 0) || s > 600)
      refuse("ZTRAIN_TEST_HOLD", text, expected.c_str());
    holds[point] = s;
    at = end + 1;
  }
  return holds;
}

}  // namespace

FaultPlan FaultPlan::from_environment() {
  FaultPlan plan;
  if (const char* text = variable("ZTRAIN_TEST_INJECT_OVERFLOW")) {
    long long step = 0;
    int rank = -1, used = 0;
    if (std::sscanf(text, "%lld:%d%n", &step, &rank, &used) != 2 || text[used] != '\0' ||
        step < 1 || rank < 0)
      refuse("ZTRAIN_TEST_INJECT_OVERFLOW", text, "STEP:RANK, e.g. 3:1");
    plan.overflow_step = step;
    plan.overflow_rank = rank;
  }
  if (const char* text = variable("ZTRAIN_TEST_SCALE_LR")) {
    long long step = 0;
    int used = 0;
    if (std::sscanf(text, "%lld%n", &step, &used) != 1 || text[used] != '\0' || step < 1)
      refuse("ZTRAIN_TEST_SCALE_LR", text, "a step, e.g. 5");
    plan.scale_lr_step = step;
  }
  if (const char* text = variable("ZTRAIN_TEST_KILL_IN_CHECKPOINT")) {
    long long step = 0, point = 0;
    int rank = -1, used = 0;
    const int n = std::sscanf(text, "%lld:%lld%n:%d%n", &step, &point, &used, &rank, &used);
    if (n < 2 || text[used] != '\0' || point < 1 || (n == 3 && rank < 0))
      refuse("ZTRAIN_TEST_KILL_IN_CHECKPOINT", text, "STEP:K or STEP:K:RANK, e.g. 10:3");
    plan.checkpoint_kill = {step, point, n == 3 ? rank : -1};
  }
  if (const char* text = variable("ZTRAIN_TEST_KILL_AT_START")) {
    const std::string hook = text;
    const std::size_t colon = hook.find(':');
    plan.start_kill.phase = hook.substr(0, colon);
    int rank = -1, used = 0;
    if (!known_start_phase(plan.start_kill.phase) ||
        (colon != std::string::npos &&
         (std::sscanf(hook.c_str() + colon + 1, "%d%n", &rank, &used) != 1 || rank < 0 ||
          hook[colon + 1 + static_cast<std::size_t>(used)] != '\0')))
      refuse("ZTRAIN_TEST_KILL_AT_START", text,
             "PHASE or PHASE:RANK, PHASE one of store, beats, met, published, mpi_init, connected");
    plan.start_kill.rank = rank;
  }
  if (const char* text = variable("ZTRAIN_TEST_INJECT_WRITE_ERROR")) {
    const std::string s = text;
    if (s != "ENOSPC" && s != "EIO")
      refuse("ZTRAIN_TEST_INJECT_WRITE_ERROR", text, "ENOSPC or EIO");
    plan.write_error = s == "ENOSPC" ? ENOSPC : EIO;
  }
  if (const char* text = variable("ZTRAIN_TEST_INJECT_IO_ERROR")) {
    const std::string s = text;
    const auto colon = s.find(':');
    const std::string what = s.substr(0, colon);
    const long n = colon == std::string::npos ? 1 : std::atol(s.c_str() + colon + 1);
    if ((what != "ENOSPC" && what != "EIO") || n < 1)
      refuse("ZTRAIN_TEST_INJECT_IO_ERROR", text, "ENOSPC:N or EIO:N");
    plan.nvme_error = what == "ENOSPC" ? ENOSPC : EIO;
    plan.nvme_error_after = n;
  }
  if (const char* text = variable("ZTRAIN_TEST_COMPARE_PERTURB")) plan.compare_perturb = text;
  if (const char* text = variable("ZTRAIN_TEST_FAIL")) plan.failure = injected_failure(text);
  if (const char* text = variable("ZTRAIN_TEST_HOLD")) plan.holds = holds_of(text);
  return plan;
}

}  // namespace ztrain
