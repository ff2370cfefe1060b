// Hold points: the moments of a hand-off between processes where a test
// holds this process (it sleeps, saying so on stderr) so that it can start
// the competing process exactly there, instead of hoping to hit the window
// by timing. The plan comes from the run's fault plan (io/fault_plan.h,
// ZTRAIN_TEST_HOLD=POINT:SECONDS[,POINT:SECONDS...]); without one, a hold
// point costs a lookup in an empty table. The points:
//
//   lock_release        job/out_dir_lock: an ending run has removed its
//                       lock file and not yet released the lock
//   checkpoint_located  checkpoint/reader: a run directory's `latest` was
//                       read, the checkpoint it names not yet opened
//   checkpoint_opened   checkpoint/reader: the checkpoint's files are open,
//                       none of its state read yet
//   swap_created        shard/aio (the NVMe tier): this process's first
//                       swap file exists, its space reserved
//   meeting_met         comm/env_rendezvous: rank 0 has seen every rank
//                       arrive and told them; gloo has not connected yet
//
// Thread safety: plan_holds once, from main() before anything holds;
// hold_point from any thread after. In libztrain (the NVMe tier holds
// there), exported to the host as kit.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kit/kit_export.h"

namespace ztrain {

// The hold points above, in that order.
ZTRAIN_KIT const std::vector<std::string>& hold_point_names();

// The holds this process makes: seconds per point.
ZTRAIN_KIT void plan_holds(const std::map<std::string, double>& holds);

// Holds (sleeps) when the plan names `point`, the first time this process
// reaches it: a reader that retries after the hold does not hold again.
ZTRAIN_KIT void hold_point(const char* point);

}  // namespace ztrain
