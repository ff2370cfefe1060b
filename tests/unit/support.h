// Helpers shared by the unit tests: plugin directories and a Run assembled
// from TOML text with the real plugins.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "config/config.h"
#include "loader/plugin_loader.h"
#include "train/trainer.h"
#include "ztrain/data.h"

namespace ztrain::test {

// Sets (or, with nullptr, unsets) one environment variable for the life of
// the object, then puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

inline std::filesystem::path build_plugin_dir() {
  return ZTRAIN_TEST_BUILD_PLUGIN_DIR;
}
inline std::filesystem::path test_plugin_dir() {
  return ZTRAIN_TEST_PLUGIN_DIR;
}
inline std::filesystem::path source_dir() {
  return ZTRAIN_TEST_SOURCE_DIR;
}

inline PluginLoader loader() {
  return PluginLoader({build_plugin_dir()}, nullptr);
}

// A data plugin created from the body of a [data] table, not yet set up.
inline std::shared_ptr<DataSource> create_data_source(const std::string& plugin,
                                                      const std::string& body) {
  const LoadedPlugin lib = loader().load("data", plugin);
  const Options opts =
      RunConfig::parse("[data]\n" + body, "t.toml").validate("data", lib.options(), {"plugin"});
  return lib.create<DataSource>(opts);
}

inline Run make_run(const std::string& toml) {
  const RunConfig config = RunConfig::parse(toml, "test.toml");
  return assemble(config, loader());
}

// A scratch directory removed at the end of the scope.
class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("ztrain-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::filesystem::path path_;
};

// Runs f and returns the message of the exception of type E it throws;
// fails the test when it throws nothing.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("expected an exception");
  return {};
}

}  // namespace ztrain::test
