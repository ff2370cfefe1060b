// DataLoader: which global sequences each rank reads, prepared one
// micro-batch ahead on a worker thread while the current one computes.
//
// Step s of a run with micro-batch B, accumulation A and W data-parallel
// ranks reads global sequences [s*G, (s+1)*G), G = B*A*W; data rank r's
// micro-step a takes rows [(r*A + a)*B, (r*A + a + 1)*B) of that range.
// The union over ranks is the same for every W dividing G, which is what
// makes world sizes comparable. Under sequence and context parallelism
// the ranks of a group share a data rank and each takes its tokens of
// every row, as the split gives them (ztrain/sequence/split.h: Ulysses
// rank k of S holds tokens [k T/S, (k+1) T/S); ring rank r of R chunks r
// and 2R-1-r of 2R).
// Evaluation reads the first eval_batches*B*W sequences of the val split,
// the same ones at every evaluation.
//
// Trained targets: a source that declares masks (DataInfo::masks) may give
// kIgnoreTarget; step_targets() counts this rank's trained targets in the
// step about to run (reading its rows once more, beside the prefetch), so
// the loss can be normalised over the global batch before the step's
// first backward. One that does not declare them is checked as it is
// read: an ignored target from it is a DataError.
//
// Packed rows: a source that declares segments (DataInfo::segments) gives
// each token's position in its example beside the ids; the batch carries
// them (Batch::positions), checked as read: a row that does not start at
// 0, or a position that neither restarts at 0 nor follows its
// predecessor, is a DataError naming the sequence and position. Rows are
// whole then (the host refuses segments with a sequence split).
//
// Position: the number of micro-steps handed out; save it and seek() to it
// to resume exactly.
// Thread safety: one consumer thread; fill() of the source runs on the
// worker concurrently with evaluation on the consumer.
#pragma once

#include <cstdint>
#include <future>
#include <vector>

#include "ztrain/data.h"
#include "ztrain/model.h"

namespace ztrain {

// Which share of the data a rank reads: data-parallel rank `rank` of
// `ranks`, and of each row the tokens `split` gives `shard`.
struct DataShare {
  int rank = 0, ranks = 1;
  SequenceSplit split = {};
  SequenceShard shard = {};
};

class DataLoader {
 public:
  // seq_len: the whole sequence's tokens.
  DataLoader(const DataSource& source, int micro_batch, int seq_len, int grad_accum,
             DataShare share);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next training micro-batch; valid until the following call.
  Batch next();
  // Validation micro-batch j (0-based) of this rank.
  Batch val(std::int64_t j);

  // This rank's trained targets in the next grad_accum micro-batches (the
  // step about to run), of its shares of their rows: every token unless the
  // source declares masks.
  std::uint64_t step_targets() const;
  // The trained targets of a micro-batch next() or val() handed out.
  static std::uint64_t trained(const Batch& batch);
  // Whether the source declares masks (else every target is trained).
  bool masks() const { return masks_; }
  // The tokens of one micro-batch on this rank: B rows of its share.
  std::uint64_t micro_tokens() const {
    return static_cast<std::uint64_t>(B_) * static_cast<std::uint64_t>(T_ / share_.split.shards());
  }

  std::uint64_t position() const { return position_; }
  void seek(std::uint64_t micro_steps);

 private:
  // A micro-batch's rows or slices, and (sliced only) one whole row read
  // before it is sliced.
  struct Slot {
    std::vector<std::int32_t> inputs, targets, row_inputs, row_targets, positions;
  };
  void fill_train(std::uint64_t micro_step, Slot& slot) const;
  // Rows [first, first + B) of a split into the slot's shares of them.
  void fill_rows(Split split, std::uint64_t first, Slot& slot) const;
  void fill_positions(Split split, std::uint64_t index, std::int32_t* positions) const;
  Batch batch_of(const Slot& slot) const;
  void start_prefetch();

  Slot make_slot() const;
  const DataSource& source_;
  int B_, T_, A_;
  DataShare share_;
  bool masks_, segments_;
  std::uint64_t position_ = 0;
  Slot slots_[2], val_slot_;
  int current_ = 0;
  std::future<void> pending_;
};

}  // namespace ztrain
