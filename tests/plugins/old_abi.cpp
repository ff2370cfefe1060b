// A plugin as ZTRAIN_PLUGIN wrote them up to plugin ABI 10: its info, no ABI
// record. The host must refuse it without loading it.
#include "load_mark.h"
#include "ztrain/plugin.h"

namespace {
void declare(ztrain::OptionList*) {}
ztrain::Plugin* create(const ztrain::Options*) {
  return nullptr;
}
const ztrain::PluginInfo info{
    10, "strategy", "old_abi", "0.0.1", "plugin ABI 10 (test)", ZTRAIN_BUILD_ID, &declare, &create};
}  // namespace

ZTRAIN_PLUGIN_ALIAS(info)
