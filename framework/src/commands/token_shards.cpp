#include "commands/token_shards.h"

#include <array>
#include <cstdio>
#include <cstring>

#include "io/durable_file.h"

namespace ztrain {

TokenShardWriter::TokenShardWriter(std::filesystem::path dir, std::string split,
                                   std::uint64_t shard_tokens, int width)
    : dir_(std::move(dir)), split_(std::move(split)), shard_tokens_(shard_tokens), width_(width) {
  pending_.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(shard_tokens_, 1 << 24)) *
                   static_cast<std::size_t>(width_));
}

void TokenShardWriter::append(const std::vector<std::int32_t>& ids) {
  for (const std::int32_t id : ids) {
    const auto v = static_cast<std::uint32_t>(id);
    for (int b = 0; b < width_; ++b) pending_.push_back(static_cast<std::uint8_t>(v >> (8 * b)));
    ++total_;
    if (pending_.size() == shard_tokens_ * static_cast<std::uint64_t>(width_)) write_shard();
  }
}

void TokenShardWriter::finish() {
  if (!pending_.empty()) write_shard();
}

void TokenShardWriter::write_shard() {
  char name[64];
  std::snprintf(name, sizeof name, "%s_%06zu.bin", split_.c_str(), shards_.size());
  const std::uint64_t count = pending_.size() / static_cast<std::uint64_t>(width_);
  std::array<std::int32_t, 256> header{};
  header[0] = width_ == 2 ? 20240520 : 20240801;
  header[1] = width_ == 2 ? 1 : 7;
  header[2] = static_cast<std::int32_t>(count);
  const std::filesystem::path target = dir_ / name,
                              partial = dir_ / (std::string(name) + ".partial");
  DurableFile f(partial);
  f.write(header.data(), sizeof header);
  f.write(pending_.data(), pending_.size());
  f.finish();
  rename_durably(partial, target);
  shards_.push_back({name, count});
  pending_.clear();
}

}  // namespace ztrain
