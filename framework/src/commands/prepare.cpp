#include "commands/prepare.h"

#include <oneapi/tbb/parallel_for.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands/token_shards.h"
#include "io/crc32c.h"
#include "io/durable_file.h"
#include "text/documents.h"
#include "text/tokenizer.h"
#include "train/progress.h"
#include "ztrain/error.h"
#include "ztrain/file_list.h"
#include "ztrain/random.h"
#include "ztrain/units.h"

namespace ztrain {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::optional<std::int32_t> separator_id(const PrepareArgs& a, const text::Tokenizer& tok,
                                         std::string& name) {
  if (a.separator && *a.separator == "none") {
    name = "none";
    return std::nullopt;
  }
  const auto chosen = a.separator ? a.separator : text::document_start(tok, a.tokenizer);
  if (!chosen)
    throw ConfigError(a.tokenizer.string() +
                      ": no separator token (no template in post_processor, no bos_token or "
                      "eos_token in a tokenizer_config.json beside it); name it with --separator "
                      "TOKEN, or --separator none");
  const auto id = tok.token_id(*chosen);
  if (!id)
    throw ConfigError("--separator '" + *chosen + "' is not a token of " + a.tokenizer.string());
  name = *chosen;
  return id;
}

void check_out_dir(const PrepareArgs& a) {
  if (std::filesystem::exists(a.out) && !std::filesystem::is_directory(a.out))
    throw DataError("--out " + a.out.string() + " is a file, not a directory; name a directory");
  std::filesystem::create_directories(a.out);
  std::vector<std::filesystem::path> old;
  for (const auto& e : std::filesystem::directory_iterator(a.out)) {
    const std::string n = e.path().filename().string();
    if (n == "manifest.json" ||
        ((n.rfind("train_", 0) == 0 || n.rfind("val_", 0) == 0) && e.path().extension() == ".bin"))
      old.push_back(e.path());
  }
  if (old.empty()) return;
  if (!a.overwrite)
    throw DataError(a.out.string() + " holds the output of an earlier prepare (" +
                    old.front().filename().string() +
                    "); choose another --out, or --overwrite to replace it");
  for (const auto& p : old) std::filesystem::remove(p);
}

std::uint32_t file_crc(const std::filesystem::path& file) {
  const std::string bytes = read_whole_file(file);
  return crc32c(bytes.data(), bytes.size());
}

// Progress on stderr: redrawn in place on a terminal, a line each 10 s
// otherwise.
class PrepareProgress {
 public:
  explicit PrepareProgress(std::ostream& log) : log_(log), tty_(::isatty(2) != 0) {}
  void update(std::uint64_t bytes, std::uint64_t tokens, std::uint64_t docs, bool last) {
    const auto now = Clock::now();
    if (!last && now - shown_ < std::chrono::seconds(tty_ ? 1 : 10)) return;
    shown_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    char line[200];
    std::snprintf(line, sizeof line,
                  "prepare: %llu document%s, %.1f MB read, %s tokens | %.1f MB/s, %s tokens/s",
                  static_cast<unsigned long long>(docs), docs == 1 ? "" : "s",
                  static_cast<double>(bytes) / 1e6,
                  format_rate(static_cast<double>(tokens)).c_str(),
                  s > 0 ? static_cast<double>(bytes) / 1e6 / s : 0.0,
                  format_rate(s > 0 ? static_cast<double>(tokens) / s : 0.0).c_str());
    if (tty_)
      log_ << "\r" << line << "\033[K" << (last ? "\n" : "") << std::flush;
    else
      log_ << line << "\n" << std::flush;
  }

 private:
  std::ostream& log_;
  bool tty_;
  Clock::time_point start_ = Clock::now(), shown_ = Clock::now();
};

// One split's shards and its count of documents.
struct SplitOutput {
  TokenShardWriter writer;
  std::uint64_t documents = 0;
};

// The inputs' documents, tokenized in batches (at most 1024 documents or
// 16 MB, in parallel) and routed to the splits in input order.
void tokenize_all(const PrepareArgs& a, const text::Tokenizer& tok, std::optional<std::int32_t> sep,
                  text::DocumentReader& reader, SplitOutput& train, SplitOutput& val,
                  std::ostream& log) {
  PrepareProgress progress(log);
  std::uint64_t index = 0;
  for (bool more = true; more;) {
    std::vector<std::string> batch;
    std::size_t bytes = 0;
    while (batch.size() < 1024 && bytes < (16u << 20)) {
      auto doc = reader.next();
      if (!doc) {
        more = false;
        break;
      }
      bytes += doc->size();
      batch.push_back(std::move(*doc));
    }
    std::vector<std::vector<std::int32_t>> ids(batch.size());
    oneapi::tbb::parallel_for(std::size_t{0}, batch.size(), [&](std::size_t i) {
      if (sep) ids[i].push_back(*sep);
      const auto body = tok.encode(batch[i]);
      ids[i].insert(ids[i].end(), body.begin(), body.end());
    });
    for (auto& doc : ids) {
      const bool to_val =
          a.val_tokens > 0
              ? val.writer.tokens() < a.val_tokens
              : a.val_fraction > 0 &&
                    static_cast<double>(hash_combine(0x5eed, index) >> 11) * 0x1.0p-53 <
                        a.val_fraction;
      SplitOutput& split = to_val ? val : train;
      split.writer.append(doc);
      ++split.documents;
      ++index;
    }
    progress.update(reader.bytes_read(), train.writer.tokens() + val.writer.tokens(), index, !more);
  }
  train.writer.finish();
  val.writer.finish();
}

// A fraction as typed ("0.999", not "0.999000").
std::string shortest(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Why the train split is empty, and what to do.
[[noreturn]] void no_train_text(const PrepareArgs& a, const std::vector<std::string>& files,
                                const SplitOutput& val, const text::DocumentReader& reader) {
  if (val.documents > 0)
    throw DataError((a.val_tokens > 0 ? "--val-tokens " + std::to_string(a.val_tokens)
                                      : "--val-fraction " + shortest(a.val_fraction)) +
                    " took every document (" + std::to_string(val.documents) + ", " +
                    std::to_string(val.writer.tokens()) +
                    " tokens) into the validation split, leaving none to train on; documents are "
                    "not cut: give more of them (one per line of a .jsonl, or several files), or "
                    "hold out less");
  std::string names;
  for (std::size_t i = 0; i < files.size() && i < 3; ++i) names += (i ? ", " : "") + files[i];
  if (files.size() > 3) names += " and " + std::to_string(files.size() - 3) + " more";
  throw DataError("prepare's inputs hold no text to train on: " + names + " (" +
                  counted(static_cast<std::int64_t>(reader.empty_documents()), "empty document") +
                  ", " + std::to_string(reader.bytes_read()) + " bytes read)");
}

// A failed prepare leaves nothing behind that blocks the next one: the
// shards it wrote go (the manifest is written last, after every check).
void remove_outputs(const PrepareArgs& a, const SplitOutput& train, const SplitOutput& val) {
  for (const SplitOutput* split : {&train, &val})
    for (const auto& sh : split->writer.shards()) {
      std::error_code ec;
      std::filesystem::remove(a.out / sh.file, ec);
    }
}

json split_json(const SplitOutput& s) {
  json shards = json::array();
  for (const auto& sh : s.writer.shards())
    shards.push_back({{"file", sh.file}, {"tokens", sh.tokens}});
  return {{"documents", s.documents}, {"tokens", s.writer.tokens()}, {"shards", shards}};
}

}  // namespace

int prepare(const PrepareArgs& a, std::ostream& log) {
  if (a.shard_tokens < 1 || a.shard_tokens > 0x7fffffff)
    throw ConfigError("--shard-tokens " + std::to_string(a.shard_tokens) +
                      ": give 1 to 2147483647 tokens per shard (llm.c's header holds an int32)");
  if (a.val_fraction < 0 || a.val_fraction >= 1 || (a.val_fraction > 0 && a.val_tokens > 0))
    throw ConfigError("--val-fraction is in [0, 1) and excludes --val-tokens");
  const auto tok = text::load_tokenizer(a.tokenizer);
  std::string separator;
  const auto sep = separator_id(a, *tok, separator);
  const std::vector<std::string> files = expand_files(a.inputs, "prepare's inputs");
  check_out_dir(a);
  const int width = tok->vocab_size() <= 65536 ? 2 : 4;
  SplitOutput train{TokenShardWriter(a.out, "train", a.shard_tokens, width)};
  SplitOutput val{TokenShardWriter(a.out, "val", a.shard_tokens, width)};
  text::DocumentReader reader(files, {a.text_field, a.replace_invalid_utf8});
  const auto start = Clock::now();
  try {
    tokenize_all(a, *tok, sep, reader, train, val, log);
    if (train.writer.tokens() == 0) no_train_text(a, files, val, reader);
  } catch (...) {
    remove_outputs(a, train, val);
    throw;
  }
  const json manifest = {{"format", "ztrain-prepare 1"},
                         {"tokenizer",
                          {{"file", std::filesystem::absolute(a.tokenizer).string()},
                           {"crc32c", file_crc(a.tokenizer)},
                           {"identity", text::tokenizer_identity(a.tokenizer)},
                           {"vocab_size", tok->vocab_size()}}},
                         {"separator", separator},
                         {"separator_id", sep ? nlohmann::json(*sep) : nlohmann::json(nullptr)},
                         {"token_bytes", width},
                         {"inputs", files},
                         {"text_field", a.text_field},
                         {"train", split_json(train)},
                         {"val", split_json(val)}};
  write_file_atomically(a.out / "manifest.json", manifest.dump(1) + "\n");
  const std::uint64_t documents = train.documents + val.documents;
  char line[320];
  std::snprintf(
      line, sizeof line,
      "prepare: %llu document%s, %llu tokens (train %llu in %zu shard%s, val %llu in %zu) "
      "in %.1f s; uint%d, vocabulary %zu",
      static_cast<unsigned long long>(documents), documents == 1 ? "" : "s",
      static_cast<unsigned long long>(train.writer.tokens() + val.writer.tokens()),
      static_cast<unsigned long long>(train.writer.tokens()), train.writer.shards().size(),
      train.writer.shards().size() == 1 ? "" : "s",
      static_cast<unsigned long long>(val.writer.tokens()), val.writer.shards().size(),
      std::chrono::duration<double>(Clock::now() - start).count(), width * 8, tok->vocab_size());
  log << line << "\n";
  if (reader.empty_documents() > 0)
    log << "prepare: skipped "
        << counted(static_cast<std::int64_t>(reader.empty_documents()), "empty document") << "\n";
  if (reader.replaced_sequences() > 0)
    log << "prepare: replaced " << reader.replaced_sequences()
        << " invalid UTF-8 sequence(s) with U+FFFD (--replace-invalid-utf8)\n";
  log << "train on them with:\n  [data]\n  plugin = \"tokens\"\n  path = \""
      << (a.out / "train_*.bin").string() << "\"\n"
      << (val.writer.tokens() ? "  val_path = \"" + (a.out / "val_*.bin").string() + "\"\n" : "")
      << "  [model]\n  vocab_size = " << tok->vocab_size() << "\n";
  return 0;
}

}  // namespace ztrain
