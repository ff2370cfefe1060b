// The plugin loader's contract: discovery, the info check before any
// factory runs, typed creation with the library held alive, and a clear
// error (never a crash) for every broken plugin.
#include <doctest/doctest.h>

#include <fstream>

#include "support.h"
#include "ztrain/data.h"
#include "ztrain/model.h"
#include "ztrain/strategy.h"

using namespace ztrain;

namespace {
std::filesystem::path test_lib(const std::string& kind, const std::string& name) {
  return test::test_plugin_dir() / ("libztrain_" + kind + "_" + name + ".so");
}
bool contains(const std::string& s, const std::string& part) {
  INFO("message: " << s);
  return s.find(part) != std::string::npos;
}
}  // namespace

TEST_CASE("the built-in plugins are found by name, with their info and options") {
  const PluginLoader loader = test::loader();
  for (auto [kind, name] : {std::pair{"model", "transformer"},
                            {"data", "synthetic"},
                            {"data", "tokens"},
                            {"data", "text"},
                            {"data", "sft"},
                            {"strategy", "ddp"},
                            {"strategy", "zero1"},
                            {"strategy", "zero2"},
                            {"strategy", "zero3"},
                            {"strategy", "cpu_offload"},
                            {"strategy", "nvme_offload"}}) {
    const LoadedPlugin p = loader.load(kind, name);
    CHECK(std::string(p.info().kind) == kind);
    CHECK(std::string(p.info().name) == name);
    CHECK(std::string(p.info().build_id) == host_build_id());
    CHECK(p.info().abi_version == kPluginAbiVersion);
  }
  const auto all = loader.load_all();
  CHECK(all.plugins.size() == 11);
  CHECK(all.passed_over.empty());
  CHECK(loader.load("model", "transformer").options().find("n_layer")->type == OptionType::integer);
}

TEST_CASE("objects keep their library loaded after the loader's handle is gone") {
  std::shared_ptr<Model> model;
  {
    const LoadedPlugin p = test::loader().load("model", "transformer");
    model = p.create<Model>(RunConfig::parse("", "x").validate("model", p.options()));
  }
  CHECK(model->info().arch == "llama");  // code still mapped: the call works
  CHECK(model->modules().size() == 6);
}

namespace {
// Whether loading `file` ran any of its code: its static constructor
// (tests/plugins/load_mark.h) writes a file.
bool ran_code_of(const std::filesystem::path& file, std::string* error) {
  test::TempDir dir;
  const auto mark = dir / "loaded";
  ::setenv("ZTRAIN_TEST_LOAD_MARK", mark.c_str(), 1);
  try {
    test::loader().load_file(file);
  } catch (const PluginError& e) {
    *error = e.what();
  }
  ::unsetenv("ZTRAIN_TEST_LOAD_MARK");
  return std::filesystem::exists(mark);
}
}  // namespace

TEST_CASE("a wrong ABI version is refused before any plugin code runs") {
  std::string msg;
  CHECK_FALSE(ran_code_of(test_lib("strategy", "bad_abi"), &msg));
  CHECK(contains(msg,
                 "libztrain_strategy_bad_abi.so: plugin ABI version 999, but this ztrain expects " +
                     std::to_string(kPluginAbiVersion)));
  // A plugin of ABI 10 or older has no ABI record: refused unloaded too.
  CHECK_FALSE(ran_code_of(test_lib("strategy", "old_abi"), &msg));
  CHECK(
      contains(msg, "a ztrain plugin without an ABI record, so built for plugin ABI 10 or older"));
  // The mark works: loading a plugin of this ABI runs its constructor.
  msg.clear();
  CHECK(ran_code_of(test_lib("model", "throwing"), &msg));
  CHECK(msg.empty());
}

TEST_CASE("a foreign build id is refused with both values, before any plugin code runs") {
  std::string msg;
  CHECK_FALSE(ran_code_of(test_lib("strategy", "bad_build"), &msg));
  CHECK(contains(msg, "plugin built with 'clang 3.4; libc++ 1; c++201103'"));
  CHECK(contains(msg, std::string("ztrain was built with '") + host_build_id() + "'"));
}

TEST_CASE("a shared library that is not a plugin, and a file that is not a library") {
  const auto not_plugin = test::test_plugin_dir() / "libnot_a_plugin.so";
  CHECK(contains(test::message_of<PluginError>([&] { test::loader().load_file(not_plugin); }),
                 "a shared library but not a ztrain plugin"));
  test::TempDir dir;
  const auto fake = dir / "libfake.so";
  std::ofstream(fake) << "this is text, not ELF";
  CHECK(contains(test::message_of<PluginError>([&] { test::loader().load_file(fake); }),
                 "not a shared library ztrain can read"));
  CHECK(contains(test::message_of<PluginError>([&] { test::loader().load_file(dir / "none.so"); }),
                 "no such plugin file"));
}

TEST_CASE("an unknown plugin name lists what exists and where it looked") {
  const std::string msg =
      test::message_of<PluginError>([] { test::loader().load("data", "parquet"); });
  CHECK(contains(msg, "no data plugin named 'parquet' (available: sft, synthetic, text, tokens)"));
  CHECK(contains(msg, test::build_plugin_dir().string()));
  CHECK(contains(msg, "--plugin-path"));
}

TEST_CASE("a plugin of the wrong kind for its section") {
  const auto ddp = test::build_plugin_dir() / "libztrain_strategy_ddp.so";
  CHECK(contains(test::message_of<PluginError>([&] { test::loader().load("model", ddp.string()); }),
                 "a strategy plugin ('ddp'), but a model plugin is needed here"));
}

TEST_CASE("a factory that throws becomes a PluginError naming the plugin") {
  const LoadedPlugin p = test::loader().load_file(test_lib("model", "throwing"));
  const std::string msg = test::message_of<PluginError>([&] { p.create<Model>(Options{}); });
  CHECK(contains(msg, "plugin 'throwing' failed to start: cannot build the model (test)"));
}

TEST_CASE("an object that does not implement its declared kind is refused") {
  const LoadedPlugin p = test::loader().load_file(test_lib("model", "liar"));
  CHECK(contains(test::message_of<PluginError>([&] { p.create<Model>(Options{}); }),
                 "does not implement that interface"));
}

TEST_CASE("search order: --plugin-path first, then ZTRAIN_PLUGIN_PATH, then beside the binary") {
  test::TempDir cli;
  for (const char* d : {"x", "y", "z"}) std::filesystem::create_directories(cli / d);
  const std::string x = (cli / "x").string(), y = (cli / "y").string(), z = (cli / "z").string();
  ::setenv("ZTRAIN_PLUGIN_PATH", "/env/a:/env/b", 1);
  const auto dirs = default_plugin_dirs({x + ":" + y, z});
  ::unsetenv("ZTRAIN_PLUGIN_PATH");
  REQUIRE(dirs.size() >= 6);
  CHECK(dirs[0] == x);
  CHECK(dirs[2] == z);
  CHECK(dirs[3] == "/env/a");  // the environment may list directories some hosts lack
  CHECK(dirs[5].string().ends_with("lib/ztrain/plugins"));
  // A directory named on the command line must be there.
  CHECK(test::message_of<ConfigError>([&] {
          default_plugin_dirs({x + ":/no/such/dir"});
        }).find("--plugin-path '/no/such/dir' is not a directory") != std::string::npos);
}
