#include "text/sft_dataset.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "text/python_json.h"
#include "ztrain/error.h"
#include "ztrain/random.h"

namespace ztrain::text {
namespace {

namespace fs = std::filesystem;
// Rows keep their keys' order: JSON text made from them must be Python's.
using json = nlohmann::ordered_json;

// One dataset's entry of dataset_info.json, with LLaMA-Factory's defaults
// (data/parser.py's DatasetAttr).
struct DatasetAttr {
  std::string name, file_name, formatting = "alpaca";
  std::optional<std::size_t> num_samples;
  // columns
  std::string prompt = "instruction", query = "input", response = "output", history, messages,
              system, tools;
  // tags
  std::string role_tag = "from", content_tag = "value", user_tag = "human", assistant_tag = "gpt",
              observation_tag = "observation", function_tag = "function_call",
              system_tag = "system";
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path.string() + ": cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void take(const json& from, const char* key, std::string& into) {
  const auto it = from.find(key);
  if (it != from.end() && it->is_string()) into = it->get<std::string>();
}

DatasetAttr attr_of(const json& info, const std::string& name, const std::string& where) {
  const auto it = info.find(name);
  if (it == info.end() || !it->is_object())
    throw ConfigError(where + " names no dataset \"" + name +
                      "\"; add it (with its file_name) or give another [data] dataset");
  const json& e = *it;
  const std::string at = where + ": \"" + name + "\": ";
  if (!e.contains("file_name")) {
    for (const char* hub :
         {"hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"})
      if (e.contains(hub))
        throw ConfigError(at + hub +
                          " needs the network; download the dataset and give its "
                          "local file_name instead");
    throw ConfigError(at + "no file_name");
  }
  if (e.value("ranking", false))
    throw ConfigError(at +
                      "ranking = true is preference data (DPO, RM), which ztrain does not "
                      "train yet; give a supervised dataset");
  if (const auto split = e.find("split");
      split != e.end() && !(split->is_string() && split->get<std::string>() == "train"))
    throw ConfigError(at + "split " + split->dump() +
                      ": a local file holds the train split only (LLaMA-Factory loads it so); "
                      "remove the key, or give the other split its own dataset");
  DatasetAttr a;
  a.name = name;
  if (const auto n = e.find("num_samples"); n != e.end() && !n->is_null()) {
    if (!n->is_number_unsigned() || n->get<std::size_t>() == 0)
      throw ConfigError(at + "num_samples " + n->dump() + ": give a count of rows, 1 or more");
    a.num_samples = n->get<std::size_t>();
  }
  take(e, "file_name", a.file_name);
  take(e, "formatting", a.formatting);
  if (a.formatting != "alpaca" && a.formatting != "sharegpt" && a.formatting != "openai")
    throw ConfigError(at + "formatting \"" + a.formatting + "\" is not alpaca, sharegpt or openai");
  // With "columns", a column it does not name is not read (DatasetAttr.join
  // sets it to None): the defaults hold only without it.
  if (const auto c = e.find("columns"); c != e.end() && c->is_object()) {
    for (auto [key, field] : {std::pair{"prompt", &a.prompt},
                              {"query", &a.query},
                              {"response", &a.response},
                              {"history", &a.history},
                              {"messages", &a.messages},
                              {"system", &a.system},
                              {"tools", &a.tools}}) {
      field->clear();
      take(*c, key, *field);
    }
    for (const char* unbuilt : {"images", "videos", "audios", "chosen", "rejected", "kto_tag"})
      if (c->contains(unbuilt))
        throw ConfigError(at + "columns." + unbuilt +
                          " is multimodal or preference data, which ztrain does not train yet");
  }
  if (a.formatting != "alpaca" && a.messages.empty()) a.messages = "conversations";
  if (const auto t = e.find("tags"); t != e.end() && t->is_object())
    for (auto [key, field] : {std::pair{"role_tag", &a.role_tag},
                              {"content_tag", &a.content_tag},
                              {"user_tag", &a.user_tag},
                              {"assistant_tag", &a.assistant_tag},
                              {"observation_tag", &a.observation_tag},
                              {"function_tag", &a.function_tag},
                              {"system_tag", &a.system_tag}})
      take(*t, key, *field);
  return a;
}

// The line each top-level element of a JSON array starts on: a scan that
// follows strings (and their escapes) and nesting, nothing more; the
// parse itself is nlohmann's.
std::vector<std::size_t> element_lines(const std::string& text) {
  std::vector<std::size_t> lines;
  std::size_t line = 1;
  int depth = 0;
  bool in_string = false, escaped = false, expecting = false;
  for (const char c : text) {
    if (c == '\n') ++line;
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    if (depth == 1 && expecting && c != ']') lines.push_back(line), expecting = false;
    if (c == '"') in_string = true;
    if (c == '[' || c == '{') ++depth, expecting = depth == 1;
    if (c == ']' || c == '}') --depth;
    if (c == ',' && depth == 1) expecting = true;
  }
  return lines;
}

struct Row {
  json value;
  std::size_t line = 0;
  std::string file{};
};

// A JSON array of rows, or JSON lines.
std::vector<Row> rows_of(const fs::path& file) {
  const std::string ext = file.extension().string();
  if (ext != ".json" && ext != ".jsonl")
    throw ConfigError(file.string() + ": ztrain reads JSON and JSON lines datasets; convert this " +
                      (ext.empty() ? std::string("file") : ext) + " file to .jsonl");
  const std::string text = read_file(file);
  std::vector<Row> rows;
  const auto first = text.find_first_not_of(" \t\r\n");
  if (ext == ".json" && first != std::string::npos && text[first] == '[') {
    const json all = json::parse(text, nullptr, false);
    if (all.is_discarded())
      throw DataError(file.string() + ": not valid JSON; check the file (a JSON array of rows)");
    const std::vector<std::size_t> lines = element_lines(text);
    for (std::size_t i = 0; i < all.size(); ++i)
      rows.push_back({all[i], i < lines.size() ? lines[i] : 0});
    return rows;
  }
  std::istringstream in(text);
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json row = json::parse(line, nullptr, false);
    if (row.is_discarded())
      throw DataError(file.string() + ":" + std::to_string(n) +
                      ": not a JSON object; each line of a JSON lines file holds one row");
    rows.push_back({std::move(row), n});
  }
  return rows;
}

// The files of a dataset: its file, or the JSON files of its folder.
std::vector<fs::path> files_of(const fs::path& path) {
  if (!fs::exists(path))
    throw DataError(path.string() + ": no such file (dataset_info.json's file_name)");
  if (!fs::is_directory(path)) return {path};
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

// Why a row is bad, or its example.
using Aligned = std::pair<std::optional<SftExample>, std::string>;

Aligned bad(std::string why) {
  return {std::nullopt, std::move(why)};
}

// A string column, or why not.
std::optional<std::string> text_column(const json& row, const std::string& key, std::string& why) {
  const auto it = row.find(key);
  if (it == row.end()) return why = "no column \"" + key + "\"", std::nullopt;
  if (it->is_null()) return std::string();
  if (!it->is_string()) return why = "column \"" + key + "\" is not text", std::nullopt;
  return it->get<std::string>();
}

// The tools column as JSON text (a string as it is, a list dumped).
std::string tools_of(const json& row, const std::string& key) {
  if (key.empty()) return {};
  const auto it = row.find(key);
  if (it == row.end() || it->is_null()) return {};
  return it->is_string() ? it->get<std::string>() : python_dumps(*it);
}

Aligned align_alpaca(const json& row, const DatasetAttr& a, bool pretrain) {
  SftExample e;
  std::string why;
  if (!a.history.empty()) {
    const auto h = row.find(a.history);
    if (h != row.end() && h->is_array())
      for (const json& pair : *h) {
        if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string())
          return bad("column \"" + a.history + "\" holds something other than [prompt, answer]");
        e.turns.push_back({"user", pair[0]});
        e.turns.push_back({"assistant", pair[1]});
      }
  }
  std::string query;
  for (const std::string* key : {&a.prompt, &a.query}) {
    if (key->empty() || !row.contains(*key)) continue;
    const auto part = text_column(row, *key, why);
    if (!part) return bad(why);
    if (part->empty()) continue;
    query += (query.empty() ? "" : "\n") + *part;
  }
  e.turns.push_back({"user", query});
  if (pretrain) return {std::move(e), {}};
  const auto answer = text_column(row, a.response, why);
  if (!answer) return bad(why);
  e.turns.push_back({"assistant", *answer});
  if (!a.system.empty()) {
    const auto system = text_column(row, a.system, why);
    if (!system) return bad(why);
    e.system = *system;
  }
  e.tools = tools_of(row, a.tools);
  return {std::move(e), {}};
}

// LLaMA-Factory's openai converter gives every row the system prompt that
// turns Nemotron's reasoning off: "detailed thinking off" as the system
// message where there is none and no tools, appended on a line of its own
// to one that does not already say "detailed thinking on" or "off"; with
// tools, a newline after the system message. Kept, so the same files
// train the same text here.
void openai_system(SftExample& e) {
  const std::string off = "detailed thinking off";
  if (!e.tools.empty()) {
    if (!e.system.empty()) e.system += "\n";
    return;
  }
  if (e.system.empty())
    e.system = off;
  else if (e.system.find("detailed thinking on") == std::string::npos &&
           e.system.find(off) == std::string::npos)
    e.system += "\n" + off;
}

// sharegpt and openai: a leading system message, then turns whose roles
// alternate; openai's tool calls become function turns and its tool
// results, one observation turn (LLaMA-Factory's join).
Aligned align_messages(const json& row, const DatasetAttr& a) {
  const auto list = row.find(a.messages);
  if (list == row.end() || !list->is_array()) return bad("no list column \"" + a.messages + "\"");
  SftExample e;
  std::size_t start = 0;
  const auto role_of = [&](const json& m) { return m.value(a.role_tag, std::string()); };
  const auto content_of = [&](const json& m) -> std::optional<std::string> {
    const auto c = m.find(a.content_tag);
    if (c == m.end() || c->is_null()) return std::string();
    if (!c->is_string()) return std::nullopt;
    return c->get<std::string>();
  };
  for (const json& m : *list)
    if (!m.is_object()) return bad("a message of \"" + a.messages + "\" is not an object");
  if (!list->empty() && role_of((*list)[0]) == a.system_tag) {
    const auto s = content_of((*list)[0]);
    if (!s) return bad("the system message's content is not text");
    e.system = *s;
    start = 1;
  } else if (!a.system.empty() && row.contains(a.system) && row[a.system].is_string()) {
    e.system = row[a.system];
  }
  std::vector<std::string> results;
  for (std::size_t i = start; i < list->size(); ++i) {
    const json& m = (*list)[i];
    std::string role = role_of(m);
    auto content = content_of(m);
    if (!content) return bad("message " + std::to_string(i + 1) + "'s content is not text");
    if (a.formatting == "openai" && (role == a.assistant_tag || role == a.function_tag))
      if (const auto calls = m.find("tool_calls");
          calls != m.end() && calls->is_array() && !calls->empty()) {
        json functions = json::array();
        for (const json& call : *calls) functions.push_back(call.value("function", json()));
        content = python_dumps(functions);
        role = a.function_tag;
      }
    if (a.formatting == "openai" && role == a.observation_tag) {
      results.push_back(*content);
      continue;
    }
    if (!results.empty()) {
      std::string joined;
      for (const std::string& r : results)
        joined += (joined.empty() ? "" : "\n</tool_response>\n<tool_response>\n") + r;
      e.turns.push_back({"observation", joined});
      results.clear();
    }
    const std::string mapped = role == a.user_tag          ? "user"
                               : role == a.assistant_tag   ? "assistant"
                               : role == a.observation_tag ? "observation"
                               : role == a.function_tag    ? "function"
                                                           : "";
    if (mapped.empty())
      return bad("message " + std::to_string(i + 1) + " has role \"" + role + "\"");
    e.turns.push_back({mapped, *content});
  }
  for (std::size_t t = 0; t < e.turns.size(); ++t) {
    const std::string& r = e.turns[t].role;
    const bool asks = r == "user" || r == "observation";
    if (asks != (t % 2 == 0))
      return bad("turn " + std::to_string(t + 1) + " is " + (r == "assistant" ? "an " : "a ") + r +
                 " turn where " +
                 (t % 2 == 0 ? "a user or observation" : "an assistant or function") +
                 " turn belongs");
  }
  if (e.turns.size() % 2 != 0)
    return bad("an odd number of turns (" + std::to_string(e.turns.size()) +
               "): the last is not an answer");
  e.tools = tools_of(row, a.tools);
  if (a.formatting == "openai") openai_system(e);
  return {std::move(e), {}};
}

Aligned align(const json& row, const DatasetAttr& a, bool pretrain) {
  if (!row.is_object()) return bad("the row is not a JSON object");
  Aligned out = a.formatting == "alpaca" ? align_alpaca(row, a, pretrain) : align_messages(row, a);
  if (!pretrain && out.first &&
      (out.first->turns.empty() ||
       out.first->turns.back().content.find_first_not_of(" \t\r\n") == std::string::npos))
    return bad("the answer is empty");
  return out;
}

}  // namespace

// The rows a dataset trains on, as LLaMA-Factory's loader takes them:
// num_samples of dataset_info.json draws that many (every row once in a
// random order, then, past the dataset's size, rows drawn again; seeded,
// where LLaMA-Factory's draw is numpy's), then max_samples keeps the
// first ones.
std::vector<const Row*> taken(const std::vector<Row>& rows, const DatasetAttr& a,
                              const SftSampling& s) {
  std::vector<const Row*> out;
  if (!a.num_samples) {
    for (const Row& r : rows) out.push_back(&r);
  } else if (!rows.empty()) {
    const std::uint64_t seed = hash_combine(s.seed, std::hash<std::string>{}(a.name));
    const Permutation order(rows.size(), seed);
    for (std::size_t i = 0; i < *a.num_samples; ++i)
      out.push_back(&rows[i < rows.size() ? order(i) : hash_combine(seed, i) % rows.size()]);
  }
  if (s.max_samples && out.size() > s.max_samples) out.resize(s.max_samples);
  return out;
}

SftDataset read_sft_datasets(const fs::path& dataset_dir, const std::vector<std::string>& names,
                             const SftSampling& sampling) {
  const fs::path info_path = dataset_dir / "dataset_info.json";
  const json info = json::parse(read_file(info_path), nullptr, false);
  if (!info.is_object())
    throw DataError(info_path.string() + ": not a JSON object of datasets; check the file");
  SftDataset out;
  out.files.push_back(info_path.string());
  for (const std::string& name : names) {
    const DatasetAttr a = attr_of(info, name, info_path.string());
    if (sampling.pretrain && a.formatting != "alpaca")
      throw ConfigError(info_path.string() + ": " + name + " is " + a.formatting +
                        ": the pt stage reads alpaca datasets (a text column as their "
                        "\"prompt\", as LLaMA-Factory's c4_demo); give one such");
    std::vector<Row> rows;
    for (const fs::path& file : files_of(dataset_dir / a.file_name)) {
      out.files.push_back(file.string());
      for (Row& row : rows_of(file)) {
        row.file = file.string();
        rows.push_back(std::move(row));
      }
    }
    for (const Row* row : taken(rows, a, sampling)) {
      const std::string where = row->file + ":" + std::to_string(row->line);
      auto [example, why] = align(row->value, a, sampling.pretrain);
      if (example) {
        example->where = where;
        out.examples.push_back(std::move(*example));
        continue;
      }
      ++out.bad_rows;
      if (out.bad.size() < kBadRowsKept) out.bad.push_back(where + ": " + why);
    }
  }
  return out;
}

}  // namespace ztrain::text
