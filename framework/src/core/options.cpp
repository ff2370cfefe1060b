#include "ztrain/options.h"

#include <cmath>
#include <sstream>

#include "ztrain/error.h"

namespace ztrain {

const char* option_type_name(OptionType t) {
  switch (t) {
    case OptionType::boolean:
      return "boolean";
    case OptionType::integer:
      return "integer";
    case OptionType::number:
      return "number";
    case OptionType::string:
      return "string";
    case OptionType::size:
      return "size";
    case OptionType::duration:
      return "duration";
    case OptionType::numbers:
      return "list of numbers";
    case OptionType::files:
      return "files";
    case OptionType::names:
      return "names";
  }
  return "?";
}

std::string option_value_text(const OptionValue& v) {
  std::ostringstream os;
  os.precision(10);
  if (std::holds_alternative<std::monostate>(v)) return "(none)";
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) {
    os << *d;
    return os.str();
  }
  if (auto* s = std::get_if<std::string>(&v)) return "\"" + *s + "\"";
  if (auto* files = std::get_if<std::vector<std::string>>(&v)) {
    if (files->size() == 1) return "\"" + files->front() + "\"";
    std::string text = "[";
    for (const auto& f : *files) text += (text.size() > 1 ? ", \"" : "\"") + f + "\"";
    return text + "]";
  }
  const auto& list = std::get<std::vector<double>>(v);
  os << "[";
  for (std::size_t i = 0; i < list.size(); ++i) os << (i ? ", " : "") << list[i];
  os << "]";
  return os.str();
}

std::string OptionSpec::expectation() const {
  const bool numeric = type == OptionType::number || type == OptionType::integer;
  std::ostringstream os;
  os.precision(10);
  switch (type) {
    case OptionType::boolean:
      os << "true or false";
      break;
    case OptionType::integer:
      os << "an integer";
      break;
    case OptionType::number:
      os << "a number";
      break;
    case OptionType::string:
      os << "a string";
      break;
    case OptionType::size:
      os << "a size (bytes, e.g. 5e8 or \"2GiB\")";
      break;
    case OptionType::duration:
      os << "a duration (seconds, e.g. 300 or \"5m\")";
      break;
    case OptionType::numbers:
      os << "a list of numbers";
      break;
    case OptionType::files:
      os << "a file name or glob pattern, or a list of them";
      break;
    case OptionType::names:
      os << "a name or a list of names";
      break;
  }
  if (!choices.empty() && !numeric) {
    os << ": one of ";
    for (std::size_t i = 0; i < choices.size(); ++i)
      os << (i ? ", " : "") << '"' << choices[i] << '"';
  }
  if (min && max)
    os << " in [" << *min << ", " << *max << "]";
  else if (min)
    os << " >= " << *min;
  else if (max)
    os << " <= " << *max;
  if (!choices.empty() && numeric) {
    os << ", or ";
    for (std::size_t i = 0; i < choices.size(); ++i)
      os << (i ? " or " : "") << '"' << choices[i] << '"';
  }
  return os.str();
}

OptionSpec& OptionList::add(OptionSpec spec) {
  if (find(spec.name)) throw InternalError("option '" + spec.name + "' declared twice");
  specs_.push_back(std::move(spec));
  return specs_.back();
}

OptionSpec& OptionList::flag(std::string name, bool def, std::string help) {
  return add({std::move(name), OptionType::boolean, def, std::move(help), {}, {}, {}, false});
}
OptionSpec& OptionList::integer(std::string name, std::int64_t def, std::string help) {
  return add({std::move(name), OptionType::integer, def, std::move(help), {}, {}, {}, false});
}
OptionSpec& OptionList::number(std::string name, double def, std::string help) {
  return add({std::move(name), OptionType::number, def, std::move(help), {}, {}, {}, false});
}
OptionSpec& OptionList::string(std::string name, std::string def, std::string help) {
  return add(
      {std::move(name), OptionType::string, std::move(def), std::move(help), {}, {}, {}, false});
}
OptionSpec& OptionList::optional_string(std::string name, std::string help) {
  return add(
      {std::move(name), OptionType::string, std::monostate{}, std::move(help), {}, {}, {}, false});
}
OptionSpec& OptionList::size(std::string name, std::uint64_t def, std::string help) {
  return add({std::move(name),
              OptionType::size,
              static_cast<std::int64_t>(def),
              std::move(help),
              0.0,
              {},
              {},
              false});
}
OptionSpec& OptionList::duration(std::string name, double seconds, std::string help) {
  return add({std::move(name), OptionType::duration, seconds, std::move(help), 0.0, {}, {}, false});
}
OptionSpec& OptionList::numbers(std::string name, std::vector<double> def, std::string help) {
  return add(
      {std::move(name), OptionType::numbers, std::move(def), std::move(help), {}, {}, {}, false});
}

OptionSpec& OptionList::files(std::string name, std::string help) {
  return add(
      {std::move(name), OptionType::files, std::monostate{}, std::move(help), {}, {}, {}, false});
}

OptionSpec& OptionList::names(std::string name, std::string help) {
  return add(
      {std::move(name), OptionType::names, std::monostate{}, std::move(help), {}, {}, {}, false});
}

const OptionSpec* OptionList::find(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

const Options::Entry& Options::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    throw InternalError("option '" + name + "' was read but never declared by its plugin");
  return it->second;
}

namespace {
template <class T>
const T& typed(const Options::Entry& e, const std::string& name, const char* want) {
  if (auto* v = std::get_if<T>(&e.value)) return *v;
  throw InternalError("option '" + name + "' read as " + want + " but holds " +
                      option_value_text(e.value));
}
}  // namespace

bool Options::get_bool(const std::string& name) const {
  return typed<bool>(entry(name), name, "boolean");
}
std::int64_t Options::get_int(const std::string& name) const {
  return typed<std::int64_t>(entry(name), name, "integer");
}
double Options::get_number(const std::string& name) const {
  const auto& e = entry(name);
  if (auto* i = std::get_if<std::int64_t>(&e.value)) return static_cast<double>(*i);
  return typed<double>(e, name, "number");
}
const std::string& Options::get_string(const std::string& name) const {
  return typed<std::string>(entry(name), name, "string");
}
const std::vector<double>& Options::get_numbers(const std::string& name) const {
  return typed<std::vector<double>>(entry(name), name, "list of numbers");
}
const std::vector<std::string>& Options::get_files(const std::string& name) const {
  return typed<std::vector<std::string>>(entry(name), name, "files");
}
const std::vector<std::string>& Options::get_names(const std::string& name) const {
  return typed<std::vector<std::string>>(entry(name), name, "names");
}
std::optional<std::string> Options::keyword(const std::string& name) const {
  if (const auto* word = std::get_if<std::string>(&entry(name).value)) return *word;
  return std::nullopt;
}
bool Options::has_value(const std::string& name) const {
  auto it = entries_.find(name);
  return it != entries_.end() && !std::holds_alternative<std::monostate>(it->second.value);
}
bool Options::given(const std::string& name) const {
  auto it = entries_.find(name);
  return it != entries_.end() && it->second.given;
}
std::string Options::where(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? std::string("(unknown option " + name + ")") : it->second.where;
}

}  // namespace ztrain
