// text: any UTF-8 file as a byte-level token stream (vocabulary 256). The
// last val_fraction of the file is held out for evaluation.
#include <memory>
#include <optional>

#include "ztrain/data.h"
#include "ztrain/error.h"
#include "ztrain/mapped_file.h"
#include "ztrain/random.h"

namespace {

using namespace ztrain;

// Offset of the first byte that breaks UTF-8, or size when the text is valid.
std::size_t first_invalid_utf8(const std::uint8_t* s, std::size_t n) {
  std::size_t i = 0;
  while (i < n) {
    const std::uint8_t c = s[i];
    int len = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1fu;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0fu;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07u;
    } else {
      return i;
    }
    if (i + static_cast<std::size_t>(len) > n) return i;
    for (int j = 1; j < len; ++j) {
      if ((s[i + static_cast<std::size_t>(j)] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (s[i + static_cast<std::size_t>(j)] & 0x3fu);
    }
    const std::uint32_t min_cp = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min_cp || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += static_cast<std::size_t>(len);
  }
  return n;
}

class Text final : public DataSource {
 public:
  explicit Text(const Options& o)
      : path_(o.get_string("path")),
        val_fraction_(o.get_number("val_fraction")),
        shuffle_(o.get_bool("shuffle")) {}

  static void declare_options(OptionList& o) {
    o.string("path", "", "UTF-8 text file").must_be_given();
    o.number("val_fraction", 0.1, "share of the file held out for evaluation")
        .at_least(0.0)
        .at_most(0.5);
    o.flag("shuffle", true, "visit windows in a seeded order that changes every epoch");
  }

  void setup(const DataSetup& s) override {
    T_ = s.seq_len;
    if (s.vocab_size < 256)
      throw ConfigError("the text plugin reads bytes (256 token ids), but [model] vocab_size is " +
                        std::to_string(s.vocab_size) + "; set vocab_size = 256 or more");
    file_ = std::make_unique<MappedFile>(path_);
    const std::size_t bad = first_invalid_utf8(file_->data(), file_->size());
    if (bad != file_->size())
      throw DataError(path_ + ": not UTF-8 text (invalid byte sequence at byte offset " +
                      std::to_string(bad) +
                      "); the text plugin reads UTF-8 files, use the tokens "
                      "plugin for binary token files");
    const std::uint64_t n = file_->size();
    val_count_ = static_cast<std::uint64_t>(static_cast<double>(n) * val_fraction_);
    const std::uint64_t train_count = n - val_count_;
    const std::uint64_t need = static_cast<std::uint64_t>(T_) + 1;
    if (train_count < need || (s.evaluates && val_count_ < need))
      throw DataError(
          path_ + ": " + std::to_string(n) + " bytes give " + std::to_string(train_count) +
          " training and " + std::to_string(val_count_) +
          " held-out tokens; each needs at least seq_len + 1 = " + std::to_string(need) +
          " (use a longer file, a shorter seq_len or another val_fraction" +
          (val_count_ < need ? std::string(", or [train] eval_every = 0 to hold nothing out")
                             : std::string()) +
          ")");
    train_windows_.emplace(std::vector<std::uint64_t>{train_count}, T_, hash_combine(s.seed, 1),
                           shuffle_);
    if (s.evaluates)
      val_windows_.emplace(std::vector<std::uint64_t>{val_count_}, T_, hash_combine(s.seed, 2),
                           false);
    val_offset_ = train_count;
  }

  DataInfo info() const override {
    return {"text " + path_ + " (" + std::to_string(file_ ? file_->size() : 0) + " bytes)",
            std::nullopt,
            256,
            {path_},
            train_windows_ ? std::optional(train_windows_->count()) : std::nullopt,
            val_windows_ ? std::optional(val_windows_->count()) : std::nullopt,
            {},  // bytes are their own ids: no tokenizer
            {},
            std::nullopt};
  }

  void fill(Split split, std::uint64_t index, std::int32_t* inputs,
            std::int32_t* targets) const override {
    const bool train = split == Split::train;
    const std::uint64_t start =
        (train ? 0 : val_offset_) + (train ? *train_windows_ : *val_windows_).place(index).offset;
    const std::uint8_t* s = file_->data() + start;
    for (int t = 0; t < T_; ++t) {
      inputs[t] = s[t];
      targets[t] = s[t + 1];
    }
  }

 private:
  std::string path_;
  double val_fraction_;
  bool shuffle_;
  int T_ = 0;
  std::unique_ptr<MappedFile> file_;
  std::uint64_t val_offset_ = 0, val_count_ = 0;
  std::optional<TokenWindows> train_windows_, val_windows_;
};

}  // namespace

ZTRAIN_PLUGIN("data", "text", "0.1.0", "any UTF-8 text file, byte-level vocabulary of 256", Text)
