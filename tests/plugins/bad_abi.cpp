// A strategy plugin built against an ABI version the host does not speak.
#include "load_mark.h"
#include "ztrain/plugin.h"

namespace {
class BadAbi final : public ztrain::Plugin {
 public:
  explicit BadAbi(const ztrain::Options&) {}
  static void declare_options(ztrain::OptionList&) {}
};
}  // namespace

ZTRAIN_PLUGIN_WITH_ABI(999, "strategy", "bad_abi", "0.0.1", "wrong ABI version (test)", BadAbi)
