// A model plugin whose factory crashes (a null write): the host must name it.
#include "ztrain/model.h"

namespace {
class Crashing final : public ztrain::Plugin {
 public:
  explicit Crashing(const ztrain::Options&) {
    volatile int* null = nullptr;
    *null = 1;
  }
  static void declare_options(ztrain::OptionList&) {}
};
}  // namespace

ZTRAIN_PLUGIN("model", "crashing", "0.0.1", "factory crashes (test)", Crashing)
