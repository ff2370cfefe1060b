// PluginLoader: finds, checks and loads plugin libraries.
//
// Discovery looks, in order, in the --plugin-path directories,
// ZTRAIN_PLUGIN_PATH (colon-separated), <exe>/../lib/ztrain/plugins and the
// build tree, logging each directory at --verbose. A file is a candidate
// when boost::dll::library_info finds the `ztrain` section holding
// `ztrain_plugin_v1`, which reads the ELF without running plugin code. A
// plugin may also be named by a file path.
//
// Loading checks the exported PluginInfo (ABI version, build id, kind)
// before calling any function of the plugin. Objects come back in
// shared_ptrs whose deleter keeps the library loaded.
//
// Errors: PluginError naming the file and, for mismatches, both values.
// Thread safety: not thread-safe; used from the main thread.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "ztrain/error.h"
#include "ztrain/options.h"
#include "ztrain/plugin.h"

namespace ztrain {

class LoadedPlugin {
 public:
  const std::filesystem::path& file() const { return file_; }
  const PluginInfo& info() const { return *info_; }
  const OptionList& options() const { return options_; }

  // Creates the plugin's object and checks it implements T.
  template <class T>
  std::shared_ptr<T> create(const Options& options) const {
    Plugin* raw = create_raw(options);
    T* typed = dynamic_cast<T*>(raw);
    if (!typed) {
      delete raw;
      throw PluginError(file_.string() + ": plugin '" + info_->name + "' declares kind '" +
                        info_->kind + "' but its object does not implement that interface");
    }
    auto keep = info_;
    return std::shared_ptr<T>(typed, [keep](T* p) { delete p; });
  }

 private:
  friend class PluginLoader;
  Plugin* create_raw(const Options& options) const;
  std::filesystem::path file_;
  std::shared_ptr<const PluginInfo> info_;  // holds the library
  OptionList options_;
};

class PluginLoader {
 public:
  using Log = std::function<void(const std::string&)>;
  PluginLoader(std::vector<std::filesystem::path> extra_dirs, Log verbose_log);

  const std::vector<std::filesystem::path>& search_dirs() const { return dirs_; }
  // Loads the plugin of `kind` named `name`, or the library at `name` when it
  // is a path (contains '/' or ends in .so).
  LoadedPlugin load(const std::string& kind, const std::string& name) const;
  // Every plugin in the search directories (first of a kind/name wins),
  // and every candidate file not taken, with why (refused, or shadowed by
  // an earlier plugin of the same kind and name).
  struct Scan {
    std::vector<LoadedPlugin> plugins;
    std::vector<std::pair<std::filesystem::path, std::string>> passed_over;
  };
  Scan load_all() const;
  // Checks and loads one library file.
  LoadedPlugin load_file(const std::filesystem::path& file) const;

 private:
  std::vector<std::filesystem::path> candidates() const;
  std::vector<std::filesystem::path> dirs_;
  Log log_;
};

// Inside a catch block: throws a fresh host-made copy of the current
// exception (same SDK type and message; other exceptions become Error). Use
// before plugin libraries unload, so nothing in flight points into them.
[[noreturn]] void rethrow_detached();

// The directories of the default search order, given --plugin-path values.
std::vector<std::filesystem::path> default_plugin_dirs(
    const std::vector<std::string>& plugin_path_args);
// The loader a command line asks for: the default search order after its
// --plugin-path values, discovery logged on stderr with -v.
// libztrain.so as this process loaded it (the SDK plugins link; the CUDA
// backend is looked for beside it); empty when it cannot be found.
std::filesystem::path sdk_library_path();

PluginLoader command_line_loader(const std::vector<std::string>& plugin_path_args, bool verbose);

}  // namespace ztrain
