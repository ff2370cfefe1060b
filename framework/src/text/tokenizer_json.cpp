// Reads a Hugging Face tokenizer.json into a Tokenizer. Every part is
// mapped to the step that computes what `tokenizers` computes, or refused
// with its JSON key: "tokenizer.json: normalizer.normalizers[1].type is
// \"NFC\" ...". Defaults are those of the `tokenizers` library's serde
// (use_regex true, prepend_scheme "always", ...).
//
// Each type and option value read is a named part ("pre_tokenizer Split
// behavior=Removed"), recorded as it is read. kParts lists them all: a part
// outside it is refused, so the list is what the reader accepts, and
// test_tokenizer.cpp holds every entry to a golden case made by the
// tokenizers package: a part nobody has checked against tokenizers is not
// read.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "text/hf_tokenizer.h"
#include "ztrain/error.h"

namespace ztrain::text {
namespace {

using nlohmann::json;

constexpr std::string_view kParts[] = {
    "normalizer Prepend",
    "normalizer Replace",
    "normalizer Sequence",
    "pre_tokenizer ByteLevel add_prefix_space=true",
    "pre_tokenizer ByteLevel add_prefix_space=false",
    "pre_tokenizer ByteLevel use_regex=true",
    "pre_tokenizer ByteLevel use_regex=false",
    "pre_tokenizer Split pattern=String",
    "pre_tokenizer Split pattern=Regex",
    "pre_tokenizer Split behavior=Isolated",
    "pre_tokenizer Split behavior=Removed",
    "pre_tokenizer Split behavior=MergedWithPrevious",
    "pre_tokenizer Split behavior=MergedWithNext",
    "pre_tokenizer Metaspace prepend_scheme=always",
    "pre_tokenizer Metaspace prepend_scheme=first",
    "pre_tokenizer Metaspace prepend_scheme=never",
    "pre_tokenizer Metaspace add_prefix_space=true",
    "pre_tokenizer Metaspace add_prefix_space=false",
    "pre_tokenizer Metaspace split=true",
    "pre_tokenizer Metaspace split=false",
    "pre_tokenizer Metaspace replacement=U+2581",
    "pre_tokenizer Metaspace replacement=other",
    "pre_tokenizer Sequence",
    "decoder ByteLevel",
    "decoder ByteFallback",
    "decoder Fuse",
    "decoder Replace",
    "decoder Strip start=0",
    "decoder Strip start>0",
    "decoder Strip stop=0",
    "decoder Strip stop>0",
    "decoder Metaspace prepend_scheme=always",
    "decoder Metaspace prepend_scheme=first",
    "decoder Metaspace prepend_scheme=never",
    "decoder Metaspace add_prefix_space=true",
    "decoder Metaspace replacement=U+2581",
    "decoder Metaspace replacement=other",
    "decoder Sequence",
    "model BPE",
    "model byte_fallback=true",
    "model byte_fallback=false",
    "model fuse_unk=true",
    "model fuse_unk=false",
    "model ignore_merges=true",
    "model ignore_merges=false",
    "model unk_token=none",
    "model unk_token=set",
    "model merges=pairs",
    "model merges=strings",
    "added_tokens normalized=true",
    "added_tokens normalized=false",
    "added_tokens special=true",
    "added_tokens special=false",
    "post_processor TemplateProcessing start=token",
    "post_processor TemplateProcessing start=none",
    "post_processor ByteLevel",
    "post_processor Sequence",
};

// One object of the file and its key path, for messages.
struct Node {
  const json& j;
  std::string path;  // "pre_tokenizer.pretokenizers[0]"
  std::string file;
  std::set<std::string>* used;  // the parts read so far

  std::string where(const std::string& key) const {
    return file + ": " + (path.empty() ? key : path + "." + key);
  }
  // Records part "KIND WHAT", KIND the top-level key this node is under;
  // refuses a part kParts does not list.
  void use(const std::string& what) const {
    const std::string part = path.substr(0, path.find_first_of(".[")) + " " + what;
    if (std::find(std::begin(kParts), std::end(kParts), part) == std::end(kParts))
      throw ConfigError(file + ": " + path + ": " + what +
                        " has no case checked against the tokenizers package, so ztrain does "
                        "not read it; use a tokenizer without it");
    used->insert(part);
  }
  std::string yes_no(bool v) const { return v ? "true" : "false"; }
  const json* get(const std::string& key) const {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  // Found by fuzz_tokenizer: a missing key was an escaping json out_of_range.
  Node sub(const std::string& key) const {
    const json* v = get(key);
    if (!v) throw ConfigError(where(key) + " is missing");
    return {*v, path.empty() ? key : path + "." + key, file, used};
  }
  Node at(const std::string& key, std::size_t i) const {
    return {j.at(key).at(i),
            (path.empty() ? key : path + "." + key) + "[" + std::to_string(i) + "]", file, used};
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
  if (type == "Prepend") {
    n.use(type);
    return prepend_normalizer(n.text("prepend", ""));
  }
  if (type == "Replace") {
    const Pattern p = pattern_of(n);
    if (p.regex) n.unsupported("pattern", "ztrain's Replace normalizer takes a String pattern");
    n.use(type);
    return replace_normalizer(p.text, n.text("content", ""));
  }
  if (type == "Sequence") {
    n.use(type);
    return sequence_normalizer(steps_of<Normalize>(n, "normalizers", normalizer_of));
  }
  n.unsupported("type",
                "ztrain reads the normalizers Prepend, Replace and Sequence (Unicode "
                "normalization and case folding are not built); use a tokenizer without it");
}

SplitBehavior behavior_of(const Node& n) {
  const std::string b = n.text("behavior", "Isolated");
  const std::pair<const char*, SplitBehavior> known[] = {
      {"Isolated", SplitBehavior::isolated},
      {"Removed", SplitBehavior::removed},
      {"MergedWithPrevious", SplitBehavior::merged_with_previous},
      {"MergedWithNext", SplitBehavior::merged_with_next}};
  for (const auto& [name, behavior] : known)
    if (b == name) {
      n.use("Split behavior=" + b);
      return behavior;
    }
  n.unsupported("behavior",
                "ztrain splits Isolated, Removed, MergedWithPrevious or MergedWithNext");
}

// Metaspace's scheme and replacement, for the pre-tokenizer and the
// decoder alike. prepend_scheme wins over the older add_prefix_space flag,
// which may only agree with it: tokenizers refuses add_prefix_space false
// unless the scheme is "never" (its default scheme is "always"), and so
// does ztrain.
struct Metaspace {
  std::string replacement;
  std::string scheme;
};
Metaspace metaspace_of(const Node& n) {
  const json* r = n.get("replacement");
  if (!r || !r->is_string())
    throw ConfigError(n.where("replacement") + " is missing or not a string");
  const std::string replacement = r->get<std::string>();
  n.use(std::string("Metaspace replacement=") + (replacement == "\u2581" ? "U+2581" : "other"));
  const std::string s = n.text("prepend_scheme", "always");
  if (s != "always" && s != "first" && s != "never")
    n.unsupported("prepend_scheme", "expected always, first or never");
  n.use("Metaspace prepend_scheme=" + s);
  if (n.get("add_prefix_space")) {
    const bool prefix = n.flag("add_prefix_space", true);
    if (!prefix && s != "never")
      n.unsupported("add_prefix_space",
                    "it contradicts prepend_scheme \"" + s +
                        "\" (tokenizers refuses it too); write \"prepend_scheme\": \"never\"");
    n.use("Metaspace add_prefix_space=" + n.yes_no(prefix));
  }
  return {replacement, s};
}

PreTokenize pre_tokenizer_of(const Node& n) {
  const std::string type = n.text("type", "");
  if (type == "ByteLevel") {
    const bool prefix = n.flag("add_prefix_space", true), regex = n.flag("use_regex", true);
    n.use("ByteLevel add_prefix_space=" + n.yes_no(prefix));
    n.use("ByteLevel use_regex=" + n.yes_no(regex));
    return byte_level_pre_tokenizer(
        prefix,
        regex ? std::make_shared<const Regex>(gpt2_pattern(), n.where("use_regex")) : nullptr);
  }
  if (type == "Split") {
    if (n.flag("invert", false))
      n.unsupported("invert", "ztrain splits on the pattern's matches only");
    const Pattern p = pattern_of(n);
    n.use(p.regex ? "Split pattern=Regex" : "Split pattern=String");
    return split_pre_tokenizer(
        std::make_shared<const Regex>(p.regex ? p.text : escaped(p.text), n.where("pattern")),
        behavior_of(n));
  }
  if (type == "Metaspace") {
    const Metaspace m = metaspace_of(n);
    const bool split = n.flag("split", true);
    n.use("Metaspace split=" + n.yes_no(split));
    return metaspace_pre_tokenizer(m.replacement, m.scheme, split);
  }
  if (type == "Sequence") {
    n.use(type);
    return sequence_pre_tokenizer(steps_of<PreTokenize>(n, "pretokenizers", pre_tokenizer_of));
  }
  n.unsupported("type", "ztrain reads the pre-tokenizers ByteLevel, Split, Metaspace and Sequence");
}

Decode decoder_of(const Node& n) {
  const std::string type = n.text("type", "");
  if (type == "ByteLevel" || type == "ByteFallback" || type == "Fuse") n.use(type);
  if (type == "ByteLevel") return byte_level_decoder();
  if (type == "ByteFallback") return byte_fallback_decoder();
  if (type == "Fuse") return fuse_decoder();
  if (type == "Replace") {
    const Pattern p = pattern_of(n);
    if (p.regex) n.unsupported("pattern", "ztrain's Replace decoder takes a String pattern");
    n.use(type);
    return replace_decoder(p.text, n.text("content", ""));
  }
  if (type == "Strip") {
    const std::size_t start = n.count("start", 0), stop = n.count("stop", 0);
    n.use(start > 0 ? "Strip start>0" : "Strip start=0");
    n.use(stop > 0 ? "Strip stop>0" : "Strip stop=0");
    return strip_decoder(n.text("content", " "), start, stop);
  }
  if (type == "Metaspace") {
    const Metaspace m = metaspace_of(n);
    return metaspace_decoder(m.replacement, m.scheme != "never");
  }
  if (type == "Sequence") {
    n.use(type);
    return sequence_decoder(steps_of<Decode>(n, "decoders", decoder_of));
  }
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
    m.use(e.is_string() ? "merges=strings" : "merges=pairs");
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
  m.use("BPE");
  BpeOptions o;
  o.byte_fallback = m.flag("byte_fallback", false);
  o.fuse_unk = m.flag("fuse_unk", false);
  o.ignore_merges = m.flag("ignore_merges", false);
  m.use("byte_fallback=" + m.yes_no(o.byte_fallback));
  m.use("fuse_unk=" + m.yes_no(o.fuse_unk));
  m.use("ignore_merges=" + m.yes_no(o.ignore_merges));
  const std::string unk = m.text("unk_token", "");
  m.use(unk.empty() ? "unk_token=none" : "unk_token=set");
  if (!unk.empty()) {
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
    const AddedToken token{content->get<std::string>(), id->get<std::int32_t>(),
                           a.flag("normalized", false), a.flag("special", false)};
    a.use("normalized=" + a.yes_no(token.normalized));
    a.use("special=" + a.yes_no(token.special));
    added.push_back(token);
  }
  return added;
}

// The special token a TemplateProcessing's single-sequence template starts
// with (Llama's BOS), in a Sequence of processors too, and the ids its
// special_tokens entry says the template inserts for it; none for a
// template of the text alone and for ByteLevel, which adds no ids. ztrain
// starts each document with that token (document_start in tokenizer.h) and
// adds nothing after it, so a template that puts tokens after the text
// ("$A </s>"), or a processor that does (Bert's, Roberta's), is refused:
// its documents would not be the ones the file describes.
struct TemplateStart {
  std::string name;
  json ids;  // null when special_tokens has no entry for it
};
std::optional<TemplateStart> template_start_of(const Node& p) {
  const std::string type = p.text("type", "");
  if (type == "ByteLevel") {
    p.use(type);
    return std::nullopt;
  }
  if (type == "Sequence") {
    p.use(type);
    std::optional<TemplateStart> start;
    for (std::size_t i = 0; i < p.size_of("processors"); ++i)
      if (auto s = template_start_of(p.at("processors", i))) {
        if (start) p.unsupported("processors", "two templates each start the text");
        start = s;
      }
    return start;
  }
  if (type != "TemplateProcessing")
    p.unsupported("type",
                  "ztrain reads the post-processors TemplateProcessing, ByteLevel and Sequence "
                  "(it starts each document with one token and adds none after it); set "
                  "post_processor to null or to a template \"<s> $A\"");
  const json* single = p.get("single");
  const auto is = [](const json& piece, const char* kind) {
    return piece.is_object() && piece.contains(kind);
  };
  const bool starts = single && single->is_array() && single->size() == 2 &&
                      is((*single)[0], "SpecialToken") && is((*single)[1], "Sequence");
  const bool alone =
      single && single->is_array() && single->size() == 1 && is((*single)[0], "Sequence");
  if (!starts && !alone)
    p.unsupported("single",
                  "ztrain starts each document with at most one special token and adds none "
                  "after the text: the template must be \"$A\" or \"<s> $A\"");
  p.use(starts ? "TemplateProcessing start=token" : "TemplateProcessing start=none");
  if (!starts) return std::nullopt;
  const json& special = (*single)[0]["SpecialToken"];
  const auto name = special.find("id");
  if (name == special.end() || !name->is_string())
    p.unsupported("single", "its special token has no name");
  TemplateStart start{name->get<std::string>(), nullptr};
  const json* entries = p.get("special_tokens");
  if (entries && entries->is_object() && entries->contains(start.name)) {
    const json& entry = (*entries)[start.name];
    if (entry.is_object() && entry.contains("ids")) start.ids = entry["ids"];
  }
  return start;
}

std::unique_ptr<HfTokenizer> read_tokenizer_json(const std::filesystem::path& file,
                                                 std::set<std::string>* used) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError("cannot read tokenizer '" + file.string() + "'");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw ConfigError(file.string() + ": not valid JSON: " + e.what());
  }
  const Node top{j, "", file.filename().string(), used};
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
  const std::optional<TemplateStart> start =
      top.get("post_processor") ? template_start_of(top.sub("post_processor")) : std::nullopt;
  if (start) parts.template_start = start->name;
  auto tok = std::make_unique<HfTokenizer>(std::move(parts));
  // The ids the template inserts for its start token must be that token's
  // own: ztrain inserts the vocabulary's id for the name.
  if (start) {
    const auto id = tok->token_id(start->name);
    if (!id)
      throw ConfigError(top.where("post_processor") + ": the template starts with \"" +
                        start->name + "\", which is not a token of this tokenizer");
    if (start->ids != json::array({*id}))
      throw ConfigError(top.where("post_processor") + ": the template's special token \"" +
                        start->name + "\" inserts " +
                        (start->ids.is_null() ? std::string("no ids") : start->ids.dump()) +
                        ", not its vocabulary id [" + std::to_string(*id) +
                        "]; fix special_tokens to match the vocabulary");
  }
  return tok;
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::filesystem::path& file) {
  std::set<std::string> used;
  return read_tokenizer_json(file, &used);
}

std::vector<std::string> tokenizer_json_parts() {
  return {std::begin(kParts), std::end(kParts)};
}

std::set<std::string> tokenizer_json_parts_used(const std::filesystem::path& file) {
  std::set<std::string> used;
  read_tokenizer_json(file, &used);
  return used;
}

}  // namespace ztrain::text
