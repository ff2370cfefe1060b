#include "config/yaml_mapping.h"

#include "ztrain/error.h"

namespace ztrain {
namespace {

// "an Accelerate config", "a LLaMA-Factory".
const char* article(const std::string& noun) {
  return !noun.empty() && std::string("AEIOUaeiou").find(noun.front()) != std::string::npos ? "an"
                                                                                            : "a";
}

}  // namespace

YAML::Node load_yaml(const std::filesystem::path& file, const std::string& format) {
  try {
    return YAML::LoadFile(file.string());
  } catch (const YAML::BadFile&) {
    throw ConfigError("cannot read " + format + " '" + file.string() + "'" +
                      (std::filesystem::exists(file) ? ": permission denied" : ": no such file"));
  } catch (const YAML::Exception& e) {
    throw ConfigError(file.string() + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": not valid YAML: " + e.msg);
  }
}

YamlMapping::YamlMapping(YAML::Node node, std::string path, std::string file, std::string format)
    : node_(std::move(node)),
      path_(std::move(path)),
      file_(std::move(file)),
      format_(std::move(format)) {
  if (node_ && !node_.IsNull() && !node_.IsMap())
    throw ConfigError(file_ + ": " + (path_.empty() ? "the file" : path_) +
                      " is not a mapping of keys to values");
}

std::string YamlMapping::where(const std::string& key) const {
  const YAML::Node v = node_ && node_.IsMap() ? node_[key] : YAML::Node();
  const YAML::Mark m = v ? v.Mark() : node_.Mark();
  return file_ + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1) + ": " +
         (path_.empty() ? key : path_ + "." + key);
}

YAML::Node YamlMapping::get(const std::string& key) {
  used_.insert(key);
  if (!node_ || !node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  const YAML::Node v = node_[key];
  return v && !v.IsNull() ? v : YAML::Node(YAML::NodeType::Undefined);
}

YamlMapping YamlMapping::sub(const std::string& key) {
  return YamlMapping(get(key), path_.empty() ? key : path_ + "." + key, file_, format_);
}

std::string YamlMapping::text(const std::string& key, const std::string& fallback) {
  const YAML::Node v = get(key);
  return v ? scalar<std::string>(v, key, "a string") : fallback;
}

std::int64_t YamlMapping::integer(const std::string& key, std::int64_t fallback) {
  const YAML::Node v = get(key);
  return v ? scalar<std::int64_t>(v, key, "an integer") : fallback;
}

double YamlMapping::number(const std::string& key, double fallback) {
  const YAML::Node v = get(key);
  return v ? scalar<double>(v, key, "a number") : fallback;
}

bool YamlMapping::flag(const std::string& key, bool fallback) {
  const YAML::Node v = get(key);
  return v ? scalar<bool>(v, key, "true or false") : fallback;
}

void YamlMapping::no_effect(const std::map<std::string, std::string>& keys,
                            std::vector<std::string>& out) {
  for (const auto& [key, why] : keys)
    if (const YAML::Node v = get(key); v && !is_default(key, v))
      out.push_back(where(key) + " has no effect in ztrain: " + why);
}

void YamlMapping::finish() const {
  if (!node_ || !node_.IsMap()) return;
  for (const auto& kv : node_) {
    if (!kv.first.IsScalar())
      throw ConfigError(file_ + ":" + std::to_string(kv.first.Mark().line + 1) + ": " +
                        (path_.empty() ? "the file" : path_) + " has a key that is not a name");
    const std::string key = kv.first.Scalar();
    if (!used_.contains(key))
      throw ConfigError(where(key) + " is not " + article(format_) + " " + format_ +
                        " key ztrain knows (or not one it supports); remove it");
  }
}

template <class T>
T YamlMapping::scalar(const YAML::Node& v, const std::string& key, const char* expected) const {
  try {
    return v.as<T>();
  } catch (const YAML::Exception&) {
    throw ConfigError(where(key) + " is " + YAML::Dump(v) + "; expected " + expected);
  }
}

bool YamlMapping::is_default(const std::string& key, const YAML::Node& v) {
  if (v.IsSequence() || v.IsMap()) return v.size() == 0;
  const std::string s = v.Scalar();
  if (key == "same_network") return s == "true";
  return s == "false" || s == "no" || s == "NO" || s == "static" || s == "main" || s.empty();
}

}  // namespace ztrain
