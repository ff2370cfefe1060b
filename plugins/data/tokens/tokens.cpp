// tokens: llm.c and nanoGPT token files.
//
// llm.c files start with a 256 x int32 header: magic 20240520 with version 1
// (uint16 tokens) or magic 20240801 with version 7 (uint32 tokens), then the
// token count; the tokens follow. nanoGPT's .bin files are bare uint16. With
// format "auto" a file whose first int32 is an llm.c magic is read as llm.c,
// and one whose first 1024 bytes have an llm.c header's shape (version 1 or
// 7, a token count, 253 zero ints) but another magic is refused as corrupt;
// only what has neither is read as nanoGPT, so a damaged header is never
// trained on as tokens. Without val_path the last val_fraction of the train
// file is held out.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "ztrain/data.h"
#include "ztrain/error.h"
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

class Tokens final : public DataSource {
 public:
  explicit Tokens(const Options& o)
      : path_(o.get_string("path")),
        val_path_(o.has_value("val_path") ? std::optional(o.get_string("val_path")) : std::nullopt),
        format_(o.get_string("format")),
        val_fraction_(o.get_number("val_fraction")),
        shuffle_(o.get_bool("shuffle")) {}

  static void declare_options(OptionList& o) {
    o.string("path", "", "training token file (llm.c .bin or nanoGPT .bin)").must_be_given();
    o.optional_string("val_path", "held-out token file; default: the tail of path");
    o.string("format", "auto", "file format").one_of({"auto", "llmc", "nanogpt"});
    o.number("val_fraction", 0.1, "share of path held out when val_path is not given")
        .at_least(0.0)
        .at_most(0.5);
    o.flag("shuffle", true, "visit windows in a seeded order that changes every epoch");
  }

  void setup(const DataSetup& s) override {
    T_ = s.seq_len;
    train_ = open_tokens(path_, format_);
    check_ids(train_, path_, s.vocab_size);
    std::uint64_t train_count = train_.count;
    if (val_path_) {
      val_ = open_tokens(*val_path_, format_);
      check_ids(val_, *val_path_, s.vocab_size);
      val_offset_ = 0;
      val_count_ = val_.count;
    } else {
      val_count_ = static_cast<std::uint64_t>(static_cast<double>(train_.count) * val_fraction_);
      train_count = train_.count - val_count_;
      val_offset_ = train_count;
    }
    const std::uint64_t need = static_cast<std::uint64_t>(T_) + 1;
    if (train_count < need)
      throw DataError(path_ + ": " + std::to_string(train_count) +
                      " training tokens, fewer than one sequence of " + std::to_string(need) +
                      " (seq_len + 1)");
    if (s.evaluates && val_count_ < need)
      throw DataError((val_path_ ? *val_path_ : path_) + ": " + std::to_string(val_count_) +
                      " held-out tokens, fewer than one sequence of " + std::to_string(need) +
                      (val_path_ ? "" : "; raise [data] val_fraction or give val_path") +
                      ", or set [train] eval_every = 0 to hold nothing out");
    train_windows_.emplace(train_count, T_, hash_combine(s.seed, 1), shuffle_);
    if (s.evaluates) val_windows_.emplace(val_count_, T_, hash_combine(s.seed, 2), false);
  }

  DataInfo info() const override {
    return {
        "tokens " + path_ + " (" + std::to_string(train_.count) + " tokens, uint" +
            std::to_string(train_.width * 8) + ")",
        std::nullopt, static_cast<int>(max_id_) + 1,
        val_path_ ? std::vector<std::string>{path_, *val_path_} : std::vector<std::string>{path_},
        train_windows_ ? std::optional(train_windows_->count()) : std::nullopt};
  }

  void fill(Split split, std::uint64_t index, std::int32_t* inputs,
            std::int32_t* targets) const override {
    const bool train = split == Split::train;
    const TokenFile& f = train || !val_path_ ? train_ : val_;
    const std::uint64_t base = train ? 0 : val_offset_;
    const std::uint64_t start = base + (train ? *train_windows_ : *val_windows_).start(index);
    for (int t = 0; t < T_; ++t) {
      inputs[t] = static_cast<std::int32_t>(f.at(start + static_cast<std::uint64_t>(t)));
      targets[t] = static_cast<std::int32_t>(f.at(start + static_cast<std::uint64_t>(t) + 1));
    }
  }

 private:
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

  std::string path_;
  std::optional<std::string> val_path_;
  std::string format_;
  double val_fraction_;
  bool shuffle_;
  int T_ = 0;
  TokenFile train_, val_;
  std::uint64_t val_offset_ = 0, val_count_ = 0;
  std::uint32_t max_id_ = 0;
  std::optional<TokenWindows> train_windows_, val_windows_;
};

}  // namespace

ZTRAIN_PLUGIN("data", "tokens", "0.1.0", "llm.c (uint16/uint32) and nanoGPT (uint16) token files",
              Tokens)
