// This machine's name, as messages, lock files and swap file names give it.
// In libztrain, exported to the host (ZTRAIN_KIT). Thread safety: any thread.
#pragma once

#include <string>

#include "kit/kit_export.h"

namespace ztrain {

ZTRAIN_KIT std::string host_name();

}  // namespace ztrain
