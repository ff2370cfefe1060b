// The YAML files other tools' users bring (Accelerate's config,
// LLaMA-Factory's training YAML), read key by key with positions.
//
// A YamlMapping is one mapping of a file: each key read once by name, its
// position for messages ("train.yaml:4:19: learning_rate"), and finish()
// refusing every key nobody read, so a typo or an unsupported key is never
// a different run. `format` names the file's kind in those refusals.
//
// Errors: ConfigError naming file:line:col and the key. Thread safety:
// values.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace ztrain {

// The file's root; ConfigError for a file that is missing or not YAML.
YAML::Node load_yaml(const std::filesystem::path& file, const std::string& format);

class YamlMapping {
 public:
  YamlMapping(YAML::Node node, std::string path, std::string file, std::string format);

  std::string where(const std::string& key) const;
  // The value of key (read), or an undefined node for one absent or null.
  YAML::Node get(const std::string& key);
  bool has(const std::string& key) { return static_cast<bool>(get(key)); }
  YamlMapping sub(const std::string& key);
  std::string text(const std::string& key, const std::string& fallback);
  std::int64_t integer(const std::string& key, std::int64_t fallback);
  double number(const std::string& key, double fallback);
  bool flag(const std::string& key, bool fallback);
  // Keys that change nothing here: read, each one set to a value that
  // turns something on (not false, no, empty; Accelerate's static and
  // main, same_network true) a warning saying why.
  void no_effect(const std::map<std::string, std::string>& keys, std::vector<std::string>& out);
  // Every key nobody read is an error.
  void finish() const;

 private:
  template <class T>
  T scalar(const YAML::Node& v, const std::string& key, const char* expected) const;
  static bool is_default(const std::string& key, const YAML::Node& v);
  YAML::Node node_;
  std::string path_, file_, format_;
  std::set<std::string> used_;
};

}  // namespace ztrain
