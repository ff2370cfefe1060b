// The names in a run's out_dir that more than one part of the job reads:
// checkpoint directories (step_<N>) and the attempts the writer leaves on
// the way to one (.tmp, .replaced, .removing). The writer makes them, the
// output checks and resume look for them.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace ztrain {

// "step_<N>"
std::string checkpoint_name(std::int64_t step);
// The step of a checkpoint directory's name (step_<N>), or -1.
std::int64_t checkpoint_step(const std::filesystem::path& dir);
// A checkpoint directory or one of its attempts (step_<N>, .tmp, .replaced,
// .removing).
bool is_checkpoint_dir(const std::filesystem::path& dir);

}  // namespace ztrain
