// Declares kind "model" but its object is not a ztrain::Model.
#include "ztrain/plugin.h"

namespace {
class Liar final : public ztrain::Plugin {
 public:
  explicit Liar(const ztrain::Options&) {}
  static void declare_options(ztrain::OptionList& o) { o.integer("depth", 3, "unused (test)"); }
};
}  // namespace

ZTRAIN_PLUGIN("model", "liar", "0.0.1", "object of the wrong interface (test)", Liar)
