// A model plugin whose factory throws a non-SDK exception.
#include <stdexcept>
#include "load_mark.h"

#include "ztrain/model.h"

namespace {
class Throwing final : public ztrain::Plugin {
 public:
  explicit Throwing(const ztrain::Options&) {
    throw std::runtime_error("cannot build the model (test)");
  }
  static void declare_options(ztrain::OptionList&) {}
};
}  // namespace

ZTRAIN_PLUGIN("model", "throwing", "0.0.1", "factory throws (test)", Throwing)
