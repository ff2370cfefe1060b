// A plugin whose build id claims another compiler.
#include "load_mark.h"
#include "ztrain/plugin.h"

namespace {
void declare(ztrain::OptionList*) {}
ztrain::Plugin* create(const ztrain::Options*) {
  return nullptr;
}
const ztrain::PluginInfo info{
    ztrain::kPluginAbiVersion,        "strategy", "bad_build", "0.0.1", "foreign build id (test)",
    "clang 3.4; libc++ 1; c++201103", &declare,   &create};
}  // namespace

ZTRAIN_PLUGIN_ALIAS(info)
ZTRAIN_PLUGIN_ABI_RECORD(ztrain::kPluginAbiVersion, "clang 3.4; libc++ 1; c++201103")
