#include "text/pretrain_encoding.h"

#include <algorithm>

#include "ztrain/kernels.h"

namespace ztrain::text {
namespace {

// DataCollatorForLanguageModeling's labels: the ids, the pad's ignored.
EncodedExample labelled(std::vector<std::int32_t> ids, const PretrainTokens& tokens) {
  EncodedExample e;
  e.labels = ids;
  if (tokens.pad) std::replace(e.labels.begin(), e.labels.end(), *tokens.pad, kIgnoreTarget);
  e.input_ids = std::move(ids);
  return e;
}

// One map batch, rows [begin, end): concatenated, cut into whole blocks.
void pack(const std::vector<SftExample>& rows, std::size_t begin, std::size_t end,
          const Tokenizer& tokenizer, const PretrainTokens& tokens, const PretrainEncoding& o,
          std::vector<PretrainBlock>& out) {
  std::vector<std::int32_t> ids;
  std::vector<std::size_t> row_of;  // the row each id came from
  for (std::size_t r = begin; r < end; ++r) {
    const std::vector<std::int32_t> doc =
        tokenizer.encode(rows[r].turns.front().content + tokens.eos);
    ids.insert(ids.end(), doc.begin(), doc.end());
    row_of.insert(row_of.end(), doc.size(), r);
  }
  for (std::size_t at = 0; at + o.cutoff_len <= ids.size(); at += o.cutoff_len) {
    std::vector<std::int32_t> block(ids.begin() + static_cast<std::ptrdiff_t>(at),
                                    ids.begin() + static_cast<std::ptrdiff_t>(at + o.cutoff_len));
    if (!tokens.bos.empty()) block.front() = tokenizer.token_id(tokens.bos).value_or(block.front());
    out.push_back({labelled(std::move(block), tokens), rows[row_of[at]].where});
  }
}

}  // namespace

std::vector<PretrainBlock> pretrain_blocks(const std::vector<SftExample>& rows,
                                           const Tokenizer& tokenizer, const PretrainTokens& tokens,
                                           const PretrainEncoding& o) {
  std::vector<PretrainBlock> out;
  if (!o.packing) {
    for (const SftExample& row : rows) {
      std::vector<std::int32_t> ids =
          tokenizer.encode(tokens.bos + row.turns.front().content + tokens.eos);
      ids.resize(std::min(ids.size(), o.cutoff_len));
      out.push_back({labelled(std::move(ids), tokens), row.where});
    }
    return out;
  }
  // datasets' map(batched=True, num_proc=workers): contiguous shards, the
  // first n % shards one row longer, each in batches of `batch` rows.
  const std::size_t n = rows.size(), shards = std::max<std::size_t>(1, std::min(o.workers, n));
  for (std::size_t s = 0; s < shards; ++s) {
    const std::size_t begin = n / shards * s + std::min(s, n % shards);
    const std::size_t end = begin + n / shards + (s < n % shards ? 1 : 0);
    for (std::size_t b = begin; b < end; b += o.batch)
      pack(rows, b, std::min(end, b + o.batch), tokenizer, tokens, o, out);
  }
  return out;
}

}  // namespace ztrain::text
