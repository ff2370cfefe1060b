#include "loader/plugin_loader.h"

#include "loader/crash_note.h"
#include "loader/elf_sections.h"

#include <algorithm>
#include <boost/dll/import.hpp>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

namespace ztrain {
namespace fs = std::filesystem;

namespace {

constexpr const char* kSection = "ztrain";
constexpr const char* kAbiSection = "ztrain_abi";
constexpr const char* kAlias = "ztrain_plugin_v1";

bool looks_like_path(const std::string& name) {
  return name.find('/') != std::string::npos || name.ends_with(".so");
}

void split_paths(const std::string& text, std::vector<fs::path>& out) {
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ':');)
    if (!part.empty()) out.emplace_back(part);
}

// The only place ztrain calls into Boost.DLL to bind the info struct:
// import_alias returns a pointer that keeps the library loaded.
std::shared_ptr<const PluginInfo> import_info(const fs::path& file) {
  boost::shared_ptr<const PluginInfo> info;
  try {
    info = boost::dll::import_alias<const PluginInfo>(boost::dll::fs::path(file.string()), kAlias,
                                                      boost::dll::load_mode::rtld_lazy);
  } catch (const std::exception& e) {
    throw PluginError(file.string() + ": cannot load the plugin library: " + e.what() +
                      " (check that its dependencies resolve: ldd " + file.string() + ")");
  }
  return std::shared_ptr<const PluginInfo>(info.get(),
                                           [info](const PluginInfo*) mutable { info.reset(); });
}

// Both sides' ABI version and build id, compared: the same for the ABI
// record read from the file and the PluginInfo of the loaded library.
void check_abi(const fs::path& file, std::uint32_t abi_version, const std::string& build_id) {
  if (abi_version != kPluginAbiVersion)
    throw PluginError(file.string() + ": plugin ABI version " + std::to_string(abi_version) +
                      ", but this ztrain expects " + std::to_string(kPluginAbiVersion) +
                      "; rebuild the plugin against this ztrain SDK");
  if (build_id != host_build_id())
    throw PluginError(file.string() + ": plugin built with '" + build_id +
                      "', but ztrain was built with '" + host_build_id() +
                      "'; C++ interfaces cross the boundary, so rebuild the plugin with the "
                      "same compiler and standard library");
}

// What is checked before the library is loaded, from the file alone (no
// plugin code runs, its static constructors included): that it is a ztrain
// plugin, and its ABI record.
void check_file(const fs::path& file) {
  std::map<std::string, std::string> sections;
  try {
    sections = read_elf_sections(file, {kSection, kAbiSection}, 4096);
  } catch (const Error& e) {
    throw PluginError(file.string() + ": not a shared library ztrain can read (" + e.what() +
                      "); a plugin is a .so built with ztrain_add_plugin()");
  }
  if (!sections.contains(kSection))
    throw PluginError(file.string() + ": a shared library but not a ztrain plugin (no '" + kAlias +
                      "' in a 'ztrain' section); build plugins with ztrain_add_plugin() and "
                      "ZTRAIN_PLUGIN(...)");
  const auto record = sections.find(kAbiSection);
  if (record == sections.end())
    throw PluginError(file.string() +
                      ": a ztrain plugin without an ABI record, so built for plugin ABI 10 or "
                      "older, but this ztrain expects " +
                      std::to_string(kPluginAbiVersion) +
                      "; rebuild the plugin against this ztrain SDK");
  PluginAbiRecord r;
  if (record->second.size() != sizeof r)
    throw PluginError(file.string() + ": its ABI record holds " +
                      std::to_string(record->second.size()) + " bytes, not " +
                      std::to_string(sizeof r) + " (two plugins linked into one library?)");
  std::memcpy(&r, record->second.data(), sizeof r);
  if (std::memcmp(r.magic, kPluginAbiMagic, sizeof r.magic) != 0)
    throw PluginError(file.string() + ": its ABI record is not one this ztrain reads");
  check_abi(file, r.abi_version, std::string(r.build_id, strnlen(r.build_id, sizeof r.build_id)));
}
}  // namespace

void rethrow_detached() {
  try {
    throw;
  } catch (const ConfigError& e) {
    throw ConfigError(e.what());
  } catch (const PluginError& e) {
    throw PluginError(e.what());
  } catch (const DataError& e) {
    throw DataError(e.what());
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(e.what());
  } catch (const CommError& e) {
    throw CommError(e.what());
  } catch (const NumericsError& e) {
    throw NumericsError(e.what());
  } catch (const InternalError& e) {
    throw InternalError(e.what());
  } catch (const Error& e) {
    throw Error(e.what());
  } catch (const std::exception& e) {
    throw Error(e.what());
  } catch (...) {
    throw Error("an exception that is not a std::exception");
  }
}

Plugin* LoadedPlugin::create_raw(const Options& options) const {
  const CrashNote note(std::string("starting plugin '") + info_->name + "' from " + file_.string());
  try {
    Plugin* p = info_->create(&options);
    if (!p) throw PluginError("the factory returned null");
    return p;
  } catch (const ConfigError&) {
    throw;
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& e) {
    throw PluginError(file_.string() + ": plugin '" + info_->name +
                      "' failed to start: " + e.what());
  } catch (...) {
    throw PluginError(file_.string() + ": plugin '" + info_->name +
                      "' failed to start with an exception that is not a std::exception");
  }
}

PluginLoader::PluginLoader(std::vector<fs::path> extra_dirs, Log verbose_log)
    : dirs_(std::move(extra_dirs)), log_(std::move(verbose_log)) {}

std::vector<fs::path> default_plugin_dirs(const std::vector<std::string>& plugin_path_args) {
  std::vector<fs::path> dirs;
  for (const auto& a : plugin_path_args) split_paths(a, dirs);
  // A directory the user named that is not there is a typo to report, not
  // a place to skip (the built-in directories below may be absent).
  for (const auto& d : dirs)
    if (!fs::is_directory(d))
      throw ConfigError("--plugin-path '" + d.string() + "' is not a directory" +
                        (fs::exists(d) ? " (a file: pass the directory holding the plugin)" : "") +
                        "; give a directory of ztrain plugins");
  if (const char* env = std::getenv("ZTRAIN_PLUGIN_PATH")) split_paths(env, dirs);
  std::error_code ec;
  const fs::path exe(boost::dll::program_location(ec).string());
  if (!ec) dirs.push_back(exe.parent_path().parent_path() / "lib" / "ztrain" / "plugins");
#ifdef ZTRAIN_BUILD_PLUGIN_DIR
  dirs.emplace_back(ZTRAIN_BUILD_PLUGIN_DIR);
#endif
  // In the build tree <exe>/../lib/ztrain/plugins is the build directory.
  std::vector<fs::path> unique;
  std::set<fs::path> seen;
  for (const auto& d : dirs)
    if (seen.insert(fs::weakly_canonical(d, ec)).second) unique.push_back(d);
  return unique;
}

std::filesystem::path sdk_library_path() {
  std::error_code ec;
  const fs::path lib(boost::dll::symbol_location(host_build_id, ec).string());
  return ec ? fs::path() : lib;
}

PluginLoader command_line_loader(const std::vector<std::string>& plugin_path_args, bool verbose) {
  PluginLoader::Log log;
  if (verbose) log = [](const std::string& m) { std::fprintf(stderr, "[ztrain] %s\n", m.c_str()); };
  return PluginLoader(default_plugin_dirs(plugin_path_args), std::move(log));
}

LoadedPlugin PluginLoader::load_file(const fs::path& file) const {
  if (!fs::exists(file)) throw PluginError(file.string() + ": no such plugin file");
  check_file(file);
  LoadedPlugin p;
  p.file_ = file;
  p.info_ = import_info(file);
  const PluginInfo& info = *p.info_;
  check_abi(file, info.abi_version, info.build_id);
  const std::string kind = info.kind;
  if (kind != "strategy" && kind != "model" && kind != "data" && kind != "schedule")
    throw PluginError(file.string() + ": unknown plugin kind '" + kind +
                      "' (expected strategy, model, data or schedule)");
  try {
    info.declare_options(&p.options_);
  } catch (const std::exception& e) {
    throw PluginError(file.string() + ": plugin '" + info.name +
                      "' failed while declaring its options: " + e.what());
  }
  return p;
}

std::vector<fs::path> PluginLoader::candidates() const {
  std::vector<fs::path> out;
  std::set<fs::path> seen;
  for (const auto& dir : dirs_) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      if (log_) log_("plugin search: " + dir.string() + " (not a directory, skipped)");
      continue;
    }
    if (log_) log_("plugin search: " + dir.string());
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file() && e.path().extension() == ".so") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      const auto canon = fs::weakly_canonical(f, ec);
      if (seen.insert(canon).second) out.push_back(f);
    }
  }
  return out;
}

LoadedPlugin PluginLoader::load(const std::string& kind, const std::string& name) const {
  if (looks_like_path(name)) {
    LoadedPlugin p = load_file(name);
    if (p.info().kind != kind)
      throw PluginError(name + ": a " + std::string(p.info().kind) + " plugin ('" + p.info().name +
                        "'), but a " + kind + " plugin is needed here");
    return p;
  }
  // The conventional file name first, so a normal start opens one library.
  for (const auto& dir : dirs_) {
    const fs::path f = dir / ("libztrain_" + kind + "_" + name + ".so");
    std::error_code ec;
    if (!fs::is_regular_file(f, ec)) continue;
    LoadedPlugin p = load_file(f);
    if (p.info().kind == kind && p.info().name == name) {
      if (log_) log_("loaded " + kind + " plugin '" + name + "' from " + f.string());
      return p;
    }
  }
  std::vector<std::string> available;
  for (const auto& f : candidates()) {
    try {
      LoadedPlugin p = load_file(f);
      if (p.info().kind == kind && p.info().name == name) {
        if (log_) log_("loaded " + kind + " plugin '" + name + "' from " + f.string());
        return p;
      }
      if (p.info().kind == kind) available.push_back(p.info().name);
    } catch (const PluginError& e) {
      if (log_) log_(std::string("skipped: ") + e.what());
    }
  }
  std::string dirs, names;
  for (const auto& d : dirs_) dirs += "\n  " + d.string();
  std::sort(available.begin(), available.end());
  available.erase(std::unique(available.begin(), available.end()), available.end());
  for (const auto& a : available) names += (names.empty() ? "" : ", ") + a;
  throw PluginError("no " + kind + " plugin named '" + name + "'" +
                    (names.empty() ? "" : " (available: " + names + ")") +
                    "; searched:" + (dirs.empty() ? " (no directories)" : dirs) +
                    "\nadd a directory with --plugin-path or ZTRAIN_PLUGIN_PATH, or name the "
                    "plugin file by path; `ztrain plugins` lists what is found");
}

PluginLoader::Scan PluginLoader::load_all() const {
  Scan out;
  std::set<std::pair<std::string, std::string>> seen;
  for (const auto& f : candidates()) {
    try {
      LoadedPlugin p = load_file(f);
      if (!seen.insert({p.info().kind, p.info().name}).second) {
        out.passed_over.emplace_back(f, std::string("shadowed by an earlier ") + p.info().kind +
                                            " plugin '" + p.info().name + "'");
        continue;
      }
      out.plugins.push_back(std::move(p));
    } catch (const PluginError& e) {
      out.passed_over.emplace_back(f, e.what());
    }
  }
  return out;
}

}  // namespace ztrain
