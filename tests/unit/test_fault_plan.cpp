// The fault plan a test's environment asks for: every ZTRAIN_TEST_* variable
// read into its field, a malformed one refused naming the variable and the
// form it takes, and nothing planned without them.
#include <doctest/doctest.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "io/fault_plan.h"
#include "support.h"
#include "ztrain/error.h"

using namespace ztrain;

TEST_CASE("fault plan: none without the variables") {
  const FaultPlan plan = FaultPlan::from_environment();
  CHECK_FALSE(plan.overflows(1, 0));
  CHECK(plan.lr_factor(1) == 1.0);
  CHECK_FALSE(plan.checkpoint_kill.applies(1, 0));
  CHECK(plan.start_kill.phase.empty());
  CHECK(plan.write_error == 0);
  CHECK(plan.nvme_error == 0);
  CHECK(plan.compare_perturb.empty());
  CHECK(plan.failure.where.empty());
  CHECK(plan.holds.empty());
  CHECK_FALSE(plan.failure.applies(1, 0));
}

TEST_CASE("fault plan: each variable read into the fault it plans") {
  const test::ScopedEnv overflow("ZTRAIN_TEST_INJECT_OVERFLOW", "3:1");
  const test::ScopedEnv lr("ZTRAIN_TEST_SCALE_LR", "5");
  const test::ScopedEnv kill("ZTRAIN_TEST_KILL_IN_CHECKPOINT", "10:3:1");
  const test::ScopedEnv start("ZTRAIN_TEST_KILL_AT_START", "published:2");
  const test::ScopedEnv write("ZTRAIN_TEST_INJECT_WRITE_ERROR", "EIO");
  const test::ScopedEnv nvme("ZTRAIN_TEST_INJECT_IO_ERROR", "ENOSPC:4");
  const test::ScopedEnv perturb("ZTRAIN_TEST_COMPARE_PERTURB", "zero3:7");
  const test::ScopedEnv fail("ZTRAIN_TEST_FAIL", "reduce:oom:2:1");
  const test::ScopedEnv hold("ZTRAIN_TEST_HOLD", "lock_release:2.5,checkpoint_located:0.25");
  const FaultPlan plan = FaultPlan::from_environment();
  CHECK(plan.overflows(3, 1));
  CHECK_FALSE(plan.overflows(3, 0));
  CHECK_FALSE(plan.overflows(4, 1));
  CHECK(plan.lr_factor(5) == 1.1);
  CHECK(plan.lr_factor(6) == 1.0);
  CHECK(plan.checkpoint_kill.applies(10, 1));
  CHECK_FALSE(plan.checkpoint_kill.applies(10, 0));
  CHECK(plan.checkpoint_kill.point == 3);
  CHECK(plan.start_kill.phase == "published");
  CHECK(plan.start_kill.rank == 2);
  CHECK(plan.write_error == EIO);
  CHECK(plan.nvme_error == ENOSPC);
  CHECK(plan.nvme_error_after == 4);
  CHECK(plan.compare_perturb == "zero3:7");
  CHECK(plan.failure.where == "reduce");
  CHECK(plan.failure.out_of_memory);
  CHECK(plan.failure.applies(2, 1));
  CHECK_FALSE(plan.failure.applies(2, 0));
  CHECK_FALSE(plan.failure.applies(3, 1));
  CHECK(plan.holds ==
        std::map<std::string, double>{{"lock_release", 2.5}, {"checkpoint_located", 0.25}});
}

TEST_CASE("fault plan: a kill in a checkpoint or a failure without a rank applies on every rank") {
  const test::ScopedEnv kill("ZTRAIN_TEST_KILL_IN_CHECKPOINT", "4:2");
  const test::ScopedEnv fail("ZTRAIN_TEST_FAIL", "checkpoint:error:4");
  const FaultPlan plan = FaultPlan::from_environment();
  CHECK_FALSE(plan.failure.out_of_memory);
  for (const int rank : {0, 3}) {
    CHECK(plan.checkpoint_kill.applies(4, rank));
    CHECK(plan.failure.applies(4, rank));
  }
  CHECK_FALSE(plan.checkpoint_kill.applies(5, 0));
  CHECK_FALSE(plan.failure.applies(5, 0));
}

TEST_CASE("fault plan: a malformed variable is refused, naming it and its form") {
  const struct {
    const char* name;
    const char* value;
    const char* form;
  } bad[] = {
      {"ZTRAIN_TEST_INJECT_OVERFLOW", "3", "STEP:RANK"},
      {"ZTRAIN_TEST_INJECT_OVERFLOW", "0:1", "STEP:RANK"},
      {"ZTRAIN_TEST_SCALE_LR", "x", "a step"},
      {"ZTRAIN_TEST_KILL_IN_CHECKPOINT", "10", "STEP:K"},
      {"ZTRAIN_TEST_KILL_AT_START", "lunch", "PHASE or PHASE:RANK"},
      {"ZTRAIN_TEST_KILL_AT_START", "met:-1", "PHASE or PHASE:RANK"},
      {"ZTRAIN_TEST_INJECT_WRITE_ERROR", "EPERM", "ENOSPC or EIO"},
      {"ZTRAIN_TEST_INJECT_IO_ERROR", "EIO:0", "ENOSPC:N or EIO:N"},
      {"ZTRAIN_TEST_FAIL", "lunch:oom:2", "WHERE:KIND:STEP"},
      {"ZTRAIN_TEST_FAIL", "reduce:panic:2", "WHERE:KIND:STEP"},
      {"ZTRAIN_TEST_FAIL", "reduce:oom:0", "WHERE:KIND:STEP"},
      {"ZTRAIN_TEST_FAIL", "reduce:oom:2:-1", "WHERE:KIND:STEP"},
      {"ZTRAIN_TEST_FAIL", "reduce:oom:2:1x", "WHERE:KIND:STEP"},
      {"ZTRAIN_TEST_HOLD", "lock_release:-1", "POINT:SECONDS"},
      {"ZTRAIN_TEST_HOLD", "lock_release:3s", "POINT:SECONDS"},
      {"ZTRAIN_TEST_HOLD", "lunch:3", "POINT:SECONDS"},
      {"ZTRAIN_TEST_HOLD", "swap_created", "POINT:SECONDS"},
      {"ZTRAIN_TEST_HOLD", "swap_created:1,swap_created:2", "POINT:SECONDS"},
      {"ZTRAIN_TEST_HOLD", "swap_created:1,", "POINT:SECONDS"},
      {"ZTRAIN_TEST_HOLD", "meeting_met:601", "POINT:SECONDS"},
  };
  for (const auto& b : bad) {
    const test::ScopedEnv env(b.name, b.value);
    const std::string msg = test::message_of<ConfigError>([] { FaultPlan::from_environment(); });
    INFO(msg);
    CHECK(msg.find(std::string(b.name) + "=" + b.value) == 0);
    CHECK(msg.find(b.form) != std::string::npos);
  }
}
