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
                  "prepare: %llu documents, %.1f MB read, %s tokens | %.1f MB/s, %s tokens/s",
                  static_cast<unsigned long long>(docs), static_cast<double>(bytes) / 1e6,
                  format_rate(static_cast<double>(tokens)).c_str(),
                  s > 0 ? static_cast<double>(bytes) / 1e6 / s : 0.0,
                  format_rate(s > 0 ? static_cast<double>(tokens) / s : 0.0).c_str());
    if (tty_)
      log_ << "\r" << line << "\033[K" << (last ? "\n" : "") << std::flush;
    else
      log_ << line << "\n" << std::flush;
  }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

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
  text::DocumentReader reader(files, a.text_field);
  PrepareProgress progress(log);
  // Batches of documents (at most 1024 or 16 MB) tokenized in parallel,
  // then routed and written in input order.
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
      const auto body = tok->encode(batch[i]);
      ids[i].insert(ids[i].end(), body.begin(), body.end());
    });
    for (auto& doc : ids) {
      const bool to_val =
          a.val_tokens > 0
              ? val.writer.tokens() < a.val_tokens
              : a.val_fraction > 0 &&
                    static_cast<double>(hash_combine(0x5eed, index) >> 11) * 0x1.0p-53 <
                        a.val_fraction;
      SplitOutput& s = to_val ? val : train;
      s.writer.append(doc);
      ++s.documents;
      ++index;
    }
    progress.update(reader.bytes_read(), train.writer.tokens() + val.writer.tokens(), index, !more);
  }
  train.writer.finish();
  val.writer.finish();
  if (train.writer.tokens() == 0)
    throw DataError("prepare's inputs hold no text to train on (" + std::to_string(index) +
                    " documents)");
  const json manifest = {{"format", "ztrain-prepare 1"},
                         {"tokenizer",
                          {{"file", std::filesystem::absolute(a.tokenizer).string()},
                           {"crc32c", file_crc(a.tokenizer)},
                           {"vocab_size", tok->vocab_size()}}},
                         {"separator", separator},
                         {"separator_id", sep ? nlohmann::json(*sep) : nlohmann::json(nullptr)},
                         {"token_bytes", width},
                         {"inputs", files},
                         {"text_field", a.text_field},
                         {"train", split_json(train)},
                         {"val", split_json(val)}};
  write_file_atomically(a.out / "manifest.json", manifest.dump(1) + "\n");
  char line[256];
  std::snprintf(
      line, sizeof line,
      "prepare: %llu documents, %llu tokens (train %llu in %zu shard(s), val %llu in %zu) "
      "in %.1f s; uint%d, vocabulary %zu",
      static_cast<unsigned long long>(index),
      static_cast<unsigned long long>(train.writer.tokens() + val.writer.tokens()),
      static_cast<unsigned long long>(train.writer.tokens()), train.writer.shards().size(),
      static_cast<unsigned long long>(val.writer.tokens()), val.writer.shards().size(),
      progress.seconds(), width * 8, tok->vocab_size());
  log << line << "\n"
      << "train on them with:\n  [data]\n  plugin = \"tokens\"\n  path = \""
      << (a.out / "train_*.bin").string() << "\"\n"
      << (val.writer.tokens() ? "  val_path = \"" + (a.out / "val_*.bin").string() + "\"\n" : "")
      << "  [model]\n  vocab_size = " << tok->vocab_size() << "\n";
  return 0;
}

}  // namespace ztrain
