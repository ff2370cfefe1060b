// TokenShardWriter: token ids into llm.c token files, the format the
// tokens data plugin reads: a 1024-byte header (magic 20240520, version
// 1, count: uint16 tokens; magic 20240801, version 7: uint32), then the
// tokens. Files are `{dir}/{split}_{index:06d}.bin` of `shard_tokens`
// each (the last one fewer), filled to the brim as llm.c fills its shards
// (a document may continue in the next file). Each file is written whole
// to a temporary beside it, synced, and renamed into place, so a file
// there is always complete.
//
// Errors: DataError from the writes (a full disk names itself). Thread
// safety: one thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace ztrain {

class TokenShardWriter {
 public:
  struct Shard {
    std::string file;  // name within dir
    std::uint64_t tokens;
  };
  // width: bytes per token, 2 or 4; shard_tokens below 2^31.
  TokenShardWriter(std::filesystem::path dir, std::string split, std::uint64_t shard_tokens,
                   int width);
  void append(const std::vector<std::int32_t>& ids);
  // Writes the last shard, if it holds any token.
  void finish();

  const std::vector<Shard>& shards() const { return shards_; }
  std::uint64_t tokens() const { return total_; }

 private:
  void write_shard();

  std::filesystem::path dir_;
  std::string split_;
  std::uint64_t shard_tokens_;
  int width_;
  std::vector<std::uint8_t> pending_;  // the current shard's tokens, little-endian
  std::uint64_t total_ = 0;
  std::vector<Shard> shards_;
};

}  // namespace ztrain
