// This machine's name, as messages, lock files and swap file names give it.
// Internal to libztrain. Thread safety: any thread.
#pragma once

#include <string>

namespace ztrain {

std::string host_name();

}  // namespace ztrain
