// The plugin boundary.
//
// A plugin is a shared library exporting one PluginInfo, a plain C-layout
// struct placed in the library's "ztrain" section under the alias
// `ztrain_plugin_v1`, and one PluginAbiRecord, plain bytes in its
// "ztrain_abi" section (ZTRAIN_PLUGIN below writes both). The host reads
// the record from the file, without loading the library, and refuses a
// plugin of another ABI version or build before any of its code runs (a
// library's static constructors run when it is loaded); it then loads the
// library, checks PluginInfo the same way and only then calls
// declare_options and create. A mismatch is a PluginError naming the file
// and both values.
//
// The C++ interfaces (Model, Strategy, DataSource) cross the boundary, so
// host and plugin must use the same compiler and standard library: build_id
// records both. Every object create() returns is owned by the host through a
// shared_ptr whose deleter also holds the library, so no object outlives its
// code. create() may throw an SDK exception; the host catches it while the
// library is loaded.
//
// Thread safety: the info struct is immutable; create() is called from one
// thread.
#pragma once

#include <cstdint>

#include "ztrain/export.h"
#include "ztrain/options.h"

namespace ztrain {

// Bumped whenever an SDK interface changes its layout or meaning.
inline constexpr std::uint32_t kPluginAbiVersion = 33;

class ZTRAIN_API Plugin {
 public:
  virtual ~Plugin();
};

struct PluginInfo {
  std::uint32_t abi_version;
  const char* kind;  // "strategy", "model", "data" or "schedule"
  const char* name;
  const char* version;
  const char* description;
  const char* build_id;
  void (*declare_options)(OptionList* out);
  Plugin* (*create)(const Options* options);
};

// What the host reads from the plugin file before loading it: no pointers,
// so the bytes in the file are the values (PluginInfo's strings are
// pointers, which only loading resolves).
struct PluginAbiRecord {
  char magic[8];  // "ztrabi1"
  std::uint32_t abi_version;
  char build_id[500];  // ZTRAIN_BUILD_ID, NUL-terminated
};
inline constexpr char kPluginAbiMagic[8] = "ztrabi1";

// The build id of the translation unit that expands it: compiler, standard
// library and language level. The host compares its own with the plugin's.
ZTRAIN_API const char* host_build_id();

}  // namespace ztrain

#define ZTRAIN_STRINGIFY_(x) #x
#define ZTRAIN_STRINGIFY(x) ZTRAIN_STRINGIFY_(x)
#if defined(_GLIBCXX_RELEASE)
#define ZTRAIN_STDLIB_ID \
  "libstdc++ " ZTRAIN_STRINGIFY(_GLIBCXX_RELEASE) "." ZTRAIN_STRINGIFY(__GLIBCXX__)
#elif defined(_LIBCPP_VERSION)
#define ZTRAIN_STDLIB_ID "libc++ " ZTRAIN_STRINGIFY(_LIBCPP_VERSION)
#else
#define ZTRAIN_STDLIB_ID "unknown stdlib"
#endif
#if defined(__clang__)
#define ZTRAIN_COMPILER_ID "clang " __clang_version__
#elif defined(__GNUC__)
#define ZTRAIN_COMPILER_ID "gcc " __VERSION__
#else
#define ZTRAIN_COMPILER_ID "unknown compiler"
#endif
#define ZTRAIN_BUILD_ID \
  ZTRAIN_COMPILER_ID "; " ZTRAIN_STDLIB_ID "; c++" ZTRAIN_STRINGIFY(__cplusplus)

// ZTRAIN_PLUGIN_WITH_ABI(abi, kind, name, version, description, Class)
// Exports Class as a plugin. Class must derive from the interface of its
// kind, have a constructor taking `const ztrain::Options&`, and a static
// `void declare_options(ztrain::OptionList&)`. Use ZTRAIN_PLUGIN; the ABI
// form exists so tests can build a deliberately mismatched library.
#define ZTRAIN_PLUGIN_WITH_ABI(ABI, KIND, NAME, VERSION, DESCRIPTION, CLASS)      \
  namespace {                                                                     \
  void ztrain_plugin_declare_options_(::ztrain::OptionList* out) {                \
    CLASS::declare_options(*out);                                                 \
  }                                                                               \
  ::ztrain::Plugin* ztrain_plugin_create_(const ::ztrain::Options* options) {     \
    return new CLASS(*options);                                                   \
  }                                                                               \
  const ::ztrain::PluginInfo ztrain_plugin_info_{(ABI),                           \
                                                 (KIND),                          \
                                                 (NAME),                          \
                                                 (VERSION),                       \
                                                 (DESCRIPTION),                   \
                                                 ZTRAIN_BUILD_ID,                 \
                                                 &ztrain_plugin_declare_options_, \
                                                 &ztrain_plugin_create_};         \
  }                                                                               \
  ZTRAIN_PLUGIN_ALIAS(ztrain_plugin_info_)                                        \
  ZTRAIN_PLUGIN_ABI_RECORD(ABI, ZTRAIN_BUILD_ID)

// The exported alias the host binds: `ztrain_plugin_v1`, a pointer to the
// PluginInfo in the library's "ztrain" section (the layout Boost.DLL's
// import_alias reads, which the host's loader uses).
#define ZTRAIN_PLUGIN_ALIAS(INFO)                                                     \
  extern "C" {                                                                        \
  extern __attribute__((visibility("default"))) const void* const ztrain_plugin_v1;   \
  [[gnu::section("ztrain"), gnu::used]] const void* const ztrain_plugin_v1 = &(INFO); \
  }

// The ABI record alone (ZTRAIN_PLUGIN_WITH_ABI writes it; tests use it to
// build a library whose record and info disagree).
#define ZTRAIN_PLUGIN_ABI_RECORD(ABI, BUILD_ID)                            \
  namespace {                                                              \
  [[gnu::section("ztrain_abi"),                                            \
    gnu::used]] const ::ztrain::PluginAbiRecord ztrain_plugin_abi_record_{ \
      {'z', 't', 'r', 'a', 'b', 'i', '1', '\0'}, (ABI), BUILD_ID};         \
  }

#define ZTRAIN_PLUGIN(KIND, NAME, VERSION, DESCRIPTION, CLASS) \
  ZTRAIN_PLUGIN_WITH_ABI(::ztrain::kPluginAbiVersion, KIND, NAME, VERSION, DESCRIPTION, CLASS)
