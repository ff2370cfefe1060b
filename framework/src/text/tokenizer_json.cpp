// Reads a Hugging Face tokenizer.json into a Tokenizer. Every part is
// mapped to the step that computes what `tokenizers` computes, or refused
// with its JSON key: "tokenizer.json: normalizer.normalizers[1].type is
// \"NFC\" ...". Defaults are those of the `tokenizers` library's serde
// (use_regex true, prepend_scheme "always", ...).
#include <fstream>
#include <nlohmann/json.hpp>

#include "text/hf_tokenizer.h"
#include "ztrain/error.h"

namespace ztrain::text {
namespace {

using nlohmann::json;

// One object of the file and its key path, for messages.
struct Node {
  const json& j;
  std::string path;  // "pre_tokenizer.pretokenizers[0]"
  std::string file;

  std::string where(const std::string& key) const {
    return file + ": " + (path.empty() ? key : path + "." + key);
  }
  const json* get(const std::string& key) const {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  // Found by fuzz_tokenizer: a missing key was an escaping json out_of_range.
  Node sub(const std::string& key) const {
    const json* v = get(key);
    if (!v) throw ConfigError(where(key) + " is missing");
    return {*v, path.empty() ? key : path + "." + key, file};
  }
  Node at(const std::string& key, std::size_t i) const {
    return {j.at(key).at(i),
            (path.empty() ? key : path + "." + key) + "[" + std::to_string(i) + "]", file};
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_string()) throw ConfigError(where(key) + " is " + v->dump() + "; expected a string");
    return v->get<std::string>();
  }
  bool flag(const std::string& key, bool fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_boolean())
      throw ConfigError(where(key) + " is " + v->dump() + "; expected true or false");
    return v->get<bool>();
  }
  std::size_t count(const std::string& key, std::size_t fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_number_unsigned())
      throw ConfigError(where(key) + " is " + v->dump() + "; expected a count");
    return v->get<std::size_t>();
  }
  std::size_t size_of(const std::string& key) const {
    const json* v = get(key);
    if (!v || !v->is_array()) throw ConfigError(where(key) + " is missing or not a list");
    return v->size();
  }
  [[noreturn]] void unsupported(const std::string& key, const std::string& what) const {
    // Found by fuzz_tokenizer: a step without its "type" was an escaping
    // json out_of_range.
    const json* v = j.is_object() ? get(key) : nullptr;
    throw ConfigError(where(key) + " is " + (v ? v->dump() : std::string("missing")) + ": " + what);
  }
};

// A Split or Replace pattern: {"String": s} or {"Regex": r}.
struct Pattern {
  std::string text;
  bool regex;
};
Pattern pattern_of(const Node& n) {
  const Node p = n.sub("pattern");
  if (const json* s = p.get("String"); s && s->is_string()) return {s->get<std::string>(), false};
  if (const json* r = p.get("Regex"); r && r->is_string()) return {r->get<std::string>(), true};
  throw ConfigError(n.where("pattern") + " is " + p.j.dump() +
                    "; expected {\"String\": ...} or {\"Regex\": ...}");
}

std::string escaped(const std::string& literal) {
  std::string out;
  for (const char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// The steps of a Sequence: each element of `key` read by `read`.
template <class Step, class Read>
std::vector<Step> steps_of(const Node& n, const std::string& key, Read read) {
  std::vector<Step> steps;
  for (std::size_t i = 0; i < n.size_of(key); ++i) steps.push_back(read(n.at(key, i)));
  return steps;
}

Normalize normalizer_of(const Node& n) {
  const std::string type = n.text("type", "");
  if (type == "Prepend") return prepend_normalizer(n.text("prepend", ""));
  if (type == "Replace") {
    const Pattern p = pattern_of(n);
    if (p.regex) n.unsupported("pattern", "ztrain's Replace normalizer takes a String pattern");
    return replace_normalizer(p.text, n.text("content", ""));
  }
  if (type == "Sequence")
    return sequence_normalizer(steps_of<Normalize>(n, "normalizers", normalizer_of));
  n.unsupported("type",
                "ztrain reads the normalizers Prepend, Replace and Sequence (Unicode "
                "normalization and case folding are not built); use a tokenizer without it");
}

SplitBehavior behavior_of(const Node& n) {
  const std::string b = n.text("behavior", "Isolated");
  if (b == "Isolated") return SplitBehavior::isolated;
  if (b == "Removed") return SplitBehavior::removed;
  if (b == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (b == "MergedWithNext") return SplitBehavior::merged_with_next;
  n.unsupported("behavior",
                "ztrain splits Isolated, Removed, MergedWithPrevious or MergedWithNext");
}

// Metaspace's scheme: prepend_scheme, or the older add_prefix_space flag.
std::string scheme_of(const Node& n) {
  if (n.get("prepend_scheme")) {
    const std::string s = n.text("prepend_scheme", "always");
    if (s != "always" && s != "first" && s != "never")
      n.unsupported("prepend_scheme", "expected always, first or never");
    return s;
  }
  return n.flag("add_prefix_space", true) ? "always" : "never";
}

PreTokenize pre_tokenizer_of(const Node& n) {
  const std::string type = n.text("type", "");
  if (type == "ByteLevel")
    return byte_level_pre_tokenizer(
        n.flag("add_prefix_space", true),
        n.flag("use_regex", true)
            ? std::make_shared<const Regex>(gpt2_pattern(), n.where("use_regex"))
            : nullptr);
  if (type == "Split") {
    if (n.flag("invert", false))
      n.unsupported("invert", "ztrain splits on the pattern's matches only");
    const Pattern p = pattern_of(n);
    return split_pre_tokenizer(
        std::make_shared<const Regex>(p.regex ? p.text : escaped(p.text), n.where("pattern")),
        behavior_of(n));
  }
  if (type == "Metaspace")
    return metaspace_pre_tokenizer(n.text("replacement", "\u2581"), scheme_of(n),
                                   n.flag("split", true));
  if (type == "Sequence")
    return sequence_pre_tokenizer(steps_of<PreTokenize>(n, "pretokenizers", pre_tokenizer_of));
  n.unsupported("type", "ztrain reads the pre-tokenizers ByteLevel, Split, Metaspace and Sequence");
}

Decode decoder_of(const Node& n) {
  const std::string type = n.text("type", "");
  if (type == "ByteLevel") return byte_level_decoder();
  if (type == "ByteFallback") return byte_fallback_decoder();
  if (type == "Fuse") return fuse_decoder();
  if (type == "Replace") {
    const Pattern p = pattern_of(n);
    if (p.regex) n.unsupported("pattern", "ztrain's Replace decoder takes a String pattern");
    return replace_decoder(p.text, n.text("content", ""));
  }
  if (type == "Strip")
    return strip_decoder(n.text("content", " "), n.count("start", 0), n.count("stop", 0));
  if (type == "Metaspace")
    return metaspace_decoder(n.text("replacement", "\u2581"), scheme_of(n) != "never");
  if (type == "Sequence") return sequence_decoder(steps_of<Decode>(n, "decoders", decoder_of));
  n.unsupported("type",
                "ztrain reads the decoders ByteLevel, Replace, ByteFallback, Fuse, Strip, "
                "Metaspace and Sequence");
}

// merges: "a b" strings (older files) or ["a", "b"] pairs.
std::vector<std::pair<std::string, std::string>> merges_of(const Node& m) {
  std::vector<std::pair<std::string, std::string>> merges;
  const json* list = m.get("merges");
  if (!list)
    throw ConfigError(m.where("merges") +
                      " is missing: a BPE model without merges would encode every word "
                      "character by character, and the tokenizers package refuses it (\"Missing "
                      "vocab/merges\"); use the tokenizer.json the model was trained with");
  if (!list->is_array())
    throw ConfigError(m.where("merges") + " is " + list->dump() + "; expected a list of merges");
  for (std::size_t i = 0; i < list->size(); ++i) {
    const json& e = (*list)[i];
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const std::size_t space = s.find(' ', 1);
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        throw ConfigError(m.where("merges") + "[" + std::to_string(i) + "] is \"" + s +
                          "\"; expected two tokens");
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      throw ConfigError(m.where("merges") + "[" + std::to_string(i) + "] is " + e.dump() +
                        "; expected a pair of tokens");
    }
  }
  return merges;
}

BpeModel model_of(const Node& m) {
  if (m.text("type", "BPE") != "BPE")
    m.unsupported("type",
                  "ztrain reads BPE models (WordPiece, Unigram and WordLevel are not built)");
  if (m.get("dropout"))
    m.unsupported("dropout",
                  "BPE dropout samples merges; ztrain encodes deterministically: set it to null");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!m.text(key, "").empty()) m.unsupported(key, "ztrain's BPE takes no subword affixes");
  const json* v = m.get("vocab");
  if (!v || !v->is_object()) throw ConfigError(m.where("vocab") + " is missing or not an object");
  std::unordered_map<std::string, std::int32_t> vocab;
  for (const auto& [token, id] : v->items()) {
    if (!id.is_number_unsigned() || id.get<std::uint64_t>() > 0x7fffffff)
      throw ConfigError(m.where("vocab") + "[\"" + token + "\"] is " + id.dump() +
                        "; expected an id");
    vocab.emplace(token, id.get<std::int32_t>());
  }
  BpeOptions o;
  o.byte_fallback = m.flag("byte_fallback", false);
  o.fuse_unk = m.flag("fuse_unk", false);
  o.ignore_merges = m.flag("ignore_merges", false);
  if (const std::string unk = m.text("unk_token", ""); !unk.empty()) {
    const auto it = vocab.find(unk);
    if (it == vocab.end())
      throw ConfigError(m.where("unk_token") + " \"" + unk + "\" is not in the vocabulary");
    o.unk = it->second;
  }
  return BpeModel(std::move(vocab), merges_of(m), o, m.file);
}

std::vector<AddedToken> added_of(const Node& top) {
  std::vector<AddedToken> added;
  if (!top.get("added_tokens")) return added;
  for (std::size_t i = 0; i < top.size_of("added_tokens"); ++i) {
    const Node a = top.at("added_tokens", i);
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      if (a.flag(key, false))
        a.unsupported(key, "ztrain matches added tokens exactly where they stand");
    const json* id = a.get("id");
    if (!id || !id->is_number_unsigned())
      throw ConfigError(a.where("id") + " is missing or not an id");
    const json* content = a.get("content");
    if (!content || !content->is_string())
      throw ConfigError(a.where("content") + " is missing or not a string");
    added.push_back({content->get<std::string>(), id->get<std::int32_t>(),
                     a.flag("normalized", false), a.flag("special", false)});
  }
  return added;
}

// The special token a TemplateProcessing's single-sequence template starts
// with (Llama's BOS), found in a Sequence of processors too; none for the
// other processors, which add nothing before the text.
std::optional<std::string> template_start_of(const json& p) {
  if (!p.is_object()) return std::nullopt;
  if (p.value("type", "") == "Sequence" && p.contains("processors"))
    for (const json& q : p["processors"])
      if (auto s = template_start_of(q)) return s;
  if (p.value("type", "") != "TemplateProcessing") return std::nullopt;
  const auto single = p.find("single");
  if (single == p.end() || !single->is_array() || single->empty()) return std::nullopt;
  const auto special = single->front().find("SpecialToken");
  if (special == single->front().end() || !special->contains("id")) return std::nullopt;
  return (*special)["id"].get<std::string>();
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError("cannot read tokenizer '" + file.string() + "'");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw ConfigError(file.string() + ": not valid JSON: " + e.what());
  }
  const Node top{j, "", file.filename().string()};
  if (!j.is_object() || !top.get("model"))
    throw ConfigError(top.where("model") + " is missing: not a tokenizer.json");
  if (top.get("truncation"))
    top.unsupported("truncation",
                    "a tokenizer that cuts its input would drop text; set it to null");
  TokenizerParts parts;
  parts.model.emplace(model_of(top.sub("model")));
  if (top.get("normalizer")) parts.normalizer = normalizer_of(top.sub("normalizer"));
  if (top.get("pre_tokenizer")) parts.pre = pre_tokenizer_of(top.sub("pre_tokenizer"));
  if (top.get("decoder")) parts.decoder = decoder_of(top.sub("decoder"));
  parts.added = added_of(top);
  if (const json* p = top.get("post_processor")) parts.template_start = template_start_of(*p);
  return std::make_unique<HfTokenizer>(std::move(parts));
}

}  // namespace ztrain::text
