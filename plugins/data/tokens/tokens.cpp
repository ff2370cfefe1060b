// tokens: llm.c and nanoGPT token files.
//
// llm.c files start with a 256 x int32 header: magic 20240520 with version 1
// (uint16 tokens) or magic 20240801 with version 7 (uint32 tokens), then the
// token count; the tokens follow. nanoGPT's .bin files are bare uint16. With
// format "auto" a file whose first int32 is an llm.c magic is read as llm.c,
// and one whose first 1024 bytes have an llm.c header's shape (version 1 or
// 7, a token count, 253 zero ints) but another magic is refused as corrupt;
// only what has neither is read as nanoGPT, so a damaged header is never
// trained on as tokens.
//
// path and val_path take one file, a glob pattern or a list (llm.c's
// FineWeb shards); windows never cross from one file into the next, and a
// shuffled epoch visits the windows of every file in one order. Without
// val_path the last val_fraction of the training tokens is held out, from
// the last file backwards.
//
// Files `ztrain prepare` wrote have a manifest.json beside them naming the
// tokenizer; a run whose vocab_size is smaller than that tokenizer's
// vocabulary is refused, naming both, before any token is read (a corpus
// that happens to use only low ids would otherwise train a model that
// cannot hold the tokenizer's other tokens).
//
// document_mask: attention never crosses from one document into the next,
// and positions restart with each (Llama 3's document masking, for
// pretraining on packed documents). Documents start with the separator
// the manifest names (`ztrain prepare` puts it before each one); a window
// that starts inside a document takes its start as that document's.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fstream>
#include <nlohmann/json.hpp>

#include "ztrain/data.h"
#include "ztrain/error.h"
#include "ztrain/file_list.h"
#include "ztrain/mapped_file.h"
#include "ztrain/random.h"

namespace {

using namespace ztrain;

constexpr std::int32_t kMagicU16 = 20240520, kMagicU32 = 20240801;
constexpr std::size_t kHeaderInts = 256;

struct TokenFile {
  std::unique_ptr<MappedFile> map;
  const std::uint8_t* tokens = nullptr;
  int width = 2;  // bytes per token
  std::uint64_t count = 0;

  std::uint32_t at(std::uint64_t i) const {
    if (width == 2) {
      std::uint16_t v;
      std::memcpy(&v, tokens + i * 2, 2);
      return v;
    }
    std::uint32_t v;
    std::memcpy(&v, tokens + i * 4, 4);
    return v;
  }
};

TokenFile open_tokens(const std::string& path, const std::string& format) {
  TokenFile f;
  f.map = std::make_unique<MappedFile>(path);
  const std::size_t size = f.map->size();
  const std::uint8_t* data = f.map->data();
  std::int32_t header[kHeaderInts] = {};
  if (size >= 4) std::memcpy(header, data, std::min(size, sizeof header));
  const bool magic_known = header[0] == kMagicU16 || header[0] == kMagicU32;
  if (format == "auto" && !magic_known && size >= sizeof header &&
      (header[1] == 1 || header[1] == 7) && header[2] >= 0 &&
      std::all_of(header + 3, header + kHeaderInts, [](std::int32_t v) { return v == 0; }))
    throw DataError(path + ": the first 1024 bytes have an llm.c header's shape (version " +
                    std::to_string(header[1]) + ", " + std::to_string(header[2]) +
                    " tokens) but its magic is " + std::to_string(header[0]) + ", not " +
                    std::to_string(kMagicU16) + " or " + std::to_string(kMagicU32) +
                    ": the file is corrupt; set [data] format = \"nanogpt\" only if it really is "
                    "a headerless token file");
  const bool llmc = format == "llmc" || (format == "auto" && magic_known);
  if (llmc) {
    if (size < sizeof header)
      throw DataError(path + ": file of " + std::to_string(size) +
                      " bytes is shorter than the 1024-byte llm.c header");
    if (!magic_known)
      throw DataError(path + ": wrong magic " + std::to_string(header[0]) +
                      " in the llm.c header (expected " + std::to_string(kMagicU16) +
                      " for uint16 or " + std::to_string(kMagicU32) +
                      " for uint32 tokens); set [data] format = \"nanogpt\" for a headerless file");
    const int want_version = header[0] == kMagicU16 ? 1 : 7;
    if (header[1] != want_version)
      throw DataError(path + ": corrupt llm.c header: magic " + std::to_string(header[0]) +
                      " goes with version " + std::to_string(want_version) + ", found version " +
                      std::to_string(header[1]));
    f.width = header[0] == kMagicU16 ? 2 : 4;
    if (header[2] < 0)
      throw DataError(path + ": corrupt llm.c header: negative token count " +
                      std::to_string(header[2]));
    f.count = static_cast<std::uint64_t>(header[2]);
    const std::uint64_t have = (size - sizeof header) / static_cast<std::uint64_t>(f.width);
    if (have != f.count || (size - sizeof header) % static_cast<std::uint64_t>(f.width) != 0)
      throw DataError(path + ": header says " + std::to_string(f.count) +
                      " tokens but the file holds " + std::to_string(size - sizeof header) +
                      " bytes of tokens (" + std::to_string(have) +
                      " tokens); the file is truncated or corrupt");
    f.tokens = data + sizeof header;
  } else {
    if (size % 2 != 0)
      throw DataError(path +
                      ": a headerless (nanoGPT) token file must hold uint16 tokens, but its "
                      "size (" +
                      std::to_string(size) + " bytes) is odd");
    f.width = 2;
    f.count = size / 2;
    f.tokens = data;
  }
  return f;
}

// What a prepare manifest says of the tokens: the tokenizer file, when it
// is still there (empty: none), its identity as recorded (empty: an older
// manifest), and the separator between documents.
struct ManifestFacts {
  std::string tokenizer, identity;
  std::optional<std::int32_t> separator;
};

// A prepare manifest beside `file` whose tokenizer has more tokens than
// the model's vocabulary: refused.
ManifestFacts check_manifest(const std::string& file, int vocab) {
  const auto path = std::filesystem::path(file).parent_path() / "manifest.json";
  std::ifstream in(path);
  if (!in) return {};
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || j.value("format", "") != "ztrain-prepare 1") return {};
  const auto tok = j.value("tokenizer", nlohmann::json::object());
  const std::uint64_t size = tok.value("vocab_size", std::uint64_t{0});
  if (size > static_cast<std::uint64_t>(vocab))
    throw DataError(path.string() + ": these tokens come from " + tok.value("file", "a tokenizer") +
                    " with " + std::to_string(size) + " tokens, more than the model's vocab_size " +
                    std::to_string(vocab) + "; set [model] vocab_size to at least " +
                    std::to_string(size));
  ManifestFacts facts;
  if (const std::string tokenizer = tok.value("file", ""); std::filesystem::exists(tokenizer))
    facts.tokenizer = tokenizer;
  if (const auto id = tok.find("identity"); id != tok.end() && id->is_string())
    facts.identity = id->get<std::string>();
  if (const auto sep = j.find("separator_id"); sep != j.end() && sep->is_number_integer())
    facts.separator = sep->get<std::int32_t>();
  return facts;
}

// A run of one file's tokens that windows are cut from: a whole shard, or
// the part of one on either side of the held-out split.
struct Piece {
  std::size_t file;
  std::uint64_t begin, count;
};

// Each file whole, in file order.
std::vector<Piece> whole_files(const std::vector<TokenFile>& files) {
  std::vector<Piece> pieces;
  for (std::size_t i = 0; i < files.size(); ++i) pieces.push_back({i, 0, files[i].count});
  return pieces;
}

// Holds out the last `held` tokens of the pieces: the held-out pieces,
// from the last file backwards, each file's tail cut off its piece.
std::vector<Piece> split_tail(std::vector<Piece>& pieces, std::uint64_t held) {
  std::vector<Piece> tail;
  while (held > 0 && !pieces.empty()) {
    Piece& last = pieces.back();
    const std::uint64_t take = std::min(held, last.count);
    tail.insert(tail.begin(), {last.file, last.begin + last.count - take, take});
    last.count -= take;
    held -= take;
    if (last.count == 0) pieces.pop_back();
  }
  return tail;
}

std::uint64_t tokens_in(const std::vector<Piece>& pieces) {
  std::uint64_t n = 0;
  for (const Piece& p : pieces) n += p.count;
  return n;
}

// Windows of T+1 tokens over the pieces (TokenWindows).
std::vector<std::uint64_t> piece_counts(const std::vector<Piece>& pieces) {
  std::vector<std::uint64_t> counts;
  for (const Piece& p : pieces) counts.push_back(p.count);
  return counts;
}

class Tokens final : public DataSource {
 public:
  explicit Tokens(const Options& o)
      : path_(o.get_files("path")),
        path_where_(o.where("path")),
        val_path_(o.has_value("val_path") ? o.get_files("val_path") : std::vector<std::string>{}),
        val_where_(o.where("val_path")),
        format_(o.get_string("format")),
        val_fraction_(o.get_number("val_fraction")),
        shuffle_(o.get_bool("shuffle")),
        document_mask_(o.get_bool("document_mask")),
        document_mask_where_(o.where("document_mask")) {}

  static void declare_options(OptionList& o) {
    o.files("path",
            "training token files (llm.c .bin or nanoGPT .bin): a file, a glob pattern such as "
            "\"fineweb_train_*.bin\", or a list of them")
        .must_be_given();
    o.files("val_path", "held-out token files, as path; default: the tail of path's tokens");
    o.string("format", "auto", "file format").one_of({"auto", "llmc", "nanogpt"});
    o.number("val_fraction", 0.1, "share of path's tokens held out when val_path is not given")
        .at_least(0.0)
        .at_most(0.5);
    o.flag("shuffle", true,
           "visit windows in a seeded order, across all files, that changes every epoch");
    o.flag("document_mask", false,
           "attention never crosses from one document into the next, positions restart with "
           "each (documents start with the separator ztrain prepare's manifest names)");
  }

  void setup(const DataSetup& s) override {
    T_ = s.seq_len;
    names_ = expand_files(path_, path_where_);
    const std::size_t n_train = names_.size();
    if (!val_path_.empty())
      for (std::string& f : expand_files(val_path_, val_where_)) names_.push_back(std::move(f));
    refuse_shared_files(n_train);
    manifest_ = check_manifest(names_.front(), s.vocab_size);
    if (document_mask_ && !manifest_.separator)
      throw ConfigError(document_mask_where_ +
                        ": [data] document_mask needs the separator each document starts with, "
                        "and " +
                        names_.front() +
                        " has no ztrain prepare manifest naming one beside it; make the tokens "
                        "with `ztrain prepare` (its --separator), or set document_mask = false");
    if (names_.size() > n_train) check_manifest(names_[n_train], s.vocab_size);
    for (const std::string& name : names_) {
      files_.push_back(open_tokens(name, format_));
      check_ids(files_.back(), name, s.vocab_size);
    }
    std::vector<Piece> all = whole_files(files_);
    val_pieces_.assign(all.begin() + static_cast<std::ptrdiff_t>(n_train), all.end());
    train_pieces_.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n_train));
    if (val_path_.empty())
      val_pieces_ = split_tail(
          train_pieces_, static_cast<std::uint64_t>(static_cast<double>(tokens_in(train_pieces_)) *
                                                    val_fraction_));
    train_windows_.emplace(piece_counts(train_pieces_), T_, hash_combine(s.seed, 1), shuffle_);
    if (train_windows_->count() == 0)
      throw DataError(files_text(0, n_train) + ": " + std::to_string(tokens_in(train_pieces_)) +
                      " training tokens, fewer than one sequence of " + std::to_string(T_ + 1) +
                      " (seq_len + 1) in any file");
    if (!s.evaluates) return;
    val_windows_.emplace(piece_counts(val_pieces_), T_, hash_combine(s.seed, 2), false);
    if (val_windows_->count() == 0)
      throw DataError(
          (val_path_.empty() ? files_text(0, n_train) : files_text(n_train, names_.size())) + ": " +
          std::to_string(tokens_in(val_pieces_)) + " held-out tokens, fewer than one sequence of " +
          std::to_string(T_ + 1) + " in any file" +
          (val_path_.empty() ? "; raise [data] val_fraction or give val_path" : "") +
          ", or set [train] eval_every = 0 to hold nothing out");
  }

  DataInfo info() const override {
    std::uint64_t tokens = 0;
    int widest = 2;
    for (const TokenFile& f : files_) {
      tokens += f.count;
      widest = std::max(widest, f.width);
    }
    const std::string what =
        names_.size() == 1 ? names_[0] : std::to_string(names_.size()) + " files";
    DataInfo d{"tokens " + what + " (" + std::to_string(tokens) + " tokens, uint" +
                   std::to_string(widest * 8) + (document_mask_ ? "; documents masked" : "") + ")",
               std::nullopt,
               static_cast<int>(max_id_) + 1,
               names_,
               train_windows_ ? std::optional(train_windows_->count()) : std::nullopt,
               val_windows_ ? std::optional(val_windows_->count()) : std::nullopt,
               manifest_.tokenizer,
               manifest_.identity,
               manifest_.separator};
    d.segments = document_mask_;
    return d;
  }

  void fill(Split split, std::uint64_t index, std::int32_t* inputs,
            std::int32_t* targets) const override {
    const auto [f, start] = window(split, index);
    for (int t = 0; t < T_; ++t) {
      inputs[t] = static_cast<std::int32_t>(f.at(start + static_cast<std::uint64_t>(t)));
      targets[t] = static_cast<std::int32_t>(f.at(start + static_cast<std::uint64_t>(t) + 1));
    }
  }

  // positions: 0 at the window's start and at every separator (a document
  // starts there), else the previous + 1.
  void fill_positions(Split split, std::uint64_t index, std::int32_t* positions) const override {
    const auto [f, start] = window(split, index);
    const auto sep = static_cast<std::uint32_t>(*manifest_.separator);
    for (int t = 0; t < T_; ++t)
      positions[t] =
          t == 0 || f.at(start + static_cast<std::uint64_t>(t)) == sep ? 0 : positions[t - 1] + 1;
  }

 private:
  // The file and first token of window `index` of a split.
  std::pair<const TokenFile&, std::uint64_t> window(Split split, std::uint64_t index) const {
    const bool train = split == Split::train;
    const TokenWindows::Place at = (train ? *train_windows_ : *val_windows_).place(index);
    const Piece& piece = (train ? train_pieces_ : val_pieces_)[at.piece];
    return {files_[piece.file], piece.begin + at.offset};
  }

  // Files [a, b) of names_ for a message: the file, or how many and the first.
  std::string files_text(std::size_t a, std::size_t b) const {
    if (b - a == 1) return names_[a];
    return std::to_string(b - a) + " files (" + names_[a] + ", ...)";
  }

  // A file both trained on and held out would make the validation loss
  // a training loss.
  void refuse_shared_files(std::size_t n_train) const {
    for (std::size_t v = n_train; v < names_.size(); ++v)
      for (std::size_t t = 0; t < n_train; ++t)
        if (std::filesystem::equivalent(names_[t], names_[v]))
          throw ConfigError(val_where_ + ": '" + names_[v] + "' is also a training file (" +
                            path_where_ +
                            "): held-out data must not be trained on; narrow path's pattern "
                            "(e.g. \"*_train_*.bin\")");
  }

  void check_ids(const TokenFile& f, const std::string& path, int vocab) {
    for (std::uint64_t i = 0; i < f.count; ++i) {
      const std::uint32_t id = f.at(i);
      if (id >= static_cast<std::uint32_t>(vocab))
        throw DataError(path + ": token " + std::to_string(i) + " has id " + std::to_string(id) +
                        ", outside the model's vocabulary (vocab_size " + std::to_string(vocab) +
                        "); raise [model] vocab_size or use the tokenizer the model was built for");
      if (id > max_id_) max_id_ = id;
    }
  }

  std::vector<std::string> path_;
  std::string path_where_;
  std::vector<std::string> val_path_;
  std::string val_where_;
  std::string format_;
  double val_fraction_;
  bool shuffle_;
  bool document_mask_;
  std::string document_mask_where_;
  int T_ = 0;
  std::vector<std::string> names_;  // the train files, then the val files
  ManifestFacts manifest_;          // the prepare manifest's, when it is there
  std::vector<TokenFile> files_;
  std::vector<Piece> train_pieces_, val_pieces_;
  std::uint32_t max_id_ = 0;
  std::optional<TokenWindows> train_windows_, val_windows_;
};

}  // namespace

ZTRAIN_PLUGIN("data", "tokens", "0.1.0", "llm.c (uint16/uint32) and nanoGPT (uint16) token files",
              Tokens)
