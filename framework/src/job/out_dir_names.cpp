#include "job/out_dir_names.h"

namespace ztrain {

namespace fs = std::filesystem;

std::string checkpoint_name(std::int64_t step) {
  return "step_" + std::to_string(step);
}

std::int64_t checkpoint_step(const fs::path& dir) {
  const std::string n = dir.filename().string();
  if (n.rfind("step_", 0) != 0 || n.size() == 5 || n.size() > 20) return -1;
  std::int64_t s = 0;
  for (std::size_t i = 5; i < n.size(); ++i) {
    if (n[i] < '0' || n[i] > '9') return -1;
    s = s * 10 + (n[i] - '0');
  }
  return s;
}

bool is_checkpoint_dir(const fs::path& dir) {
  std::string n = dir.filename().string();
  for (const char* suffix : {".tmp", ".replaced", ".removing"}) {
    const std::string x(suffix);
    if (n.size() > x.size() && n.compare(n.size() - x.size(), x.size(), x) == 0)
      n.resize(n.size() - x.size());
  }
  return checkpoint_step(fs::path(n)) >= 0;
}

}  // namespace ztrain
