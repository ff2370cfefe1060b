// FlatLayout: where each parameter lives in one contiguous flat buffer.
//
// Parameters are laid out in declaration order, each starting on an
// `align`-element boundary; the total is padded so that `world` ranks own
// equal, aligned slices [owned_begin(r), owned_end(r)). The same layout
// indexes the parameter, gradient and optimizer-state buffers, so an
// element range in one is the same parameters' range in the others (whose
// element types may differ). Padding elements are zero and stay zero.
//
// Thread safety: immutable after construction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ztrain/export.h"
#include "ztrain/model.h"

namespace ztrain::shard {

struct Segment {
  ParamId param;
  std::uint64_t begin;  // element offsets in the flat buffer
  std::uint64_t end;
};

// A gradient bucket: the flat range [begin, end) and how many parameters
// start in it.
struct BucketRange {
  std::uint64_t begin, end;
  int params;
};

// A contiguous run of a buffer: [begin, end) in flat elements.
struct Span {
  std::uint64_t begin, end;
};

class ZTRAIN_API FlatLayout {
 public:
  FlatLayout(const ParamSpecs& params, int world, std::uint64_t align = 16);

  std::uint64_t total() const { return total_; }  // padded element count
  std::uint64_t offset(ParamId p) const { return offsets_.at(p); }
  std::uint64_t numel(ParamId p) const { return numels_.at(p); }
  IdRange<ParamId> params() const { return offsets_.ids(); }
  int world() const { return world_; }
  std::uint64_t owned_begin(int rank) const { return shard_ * rank; }
  std::uint64_t owned_end(int rank) const { return shard_ * (rank + 1); }
  // The parts of parameters that fall in [begin, end), in order.
  std::vector<Segment> segments(std::uint64_t begin, std::uint64_t end) const;
  std::size_t param_count() const { return offsets_.size(); }
  // Elements of [begin, end) each rank owns (consecutive, in rank order:
  // the block counts of an irregular collective over that range).
  std::vector<std::size_t> owned_counts(std::uint64_t begin, std::uint64_t end) const;

 private:
  IdVector<ParamId, std::uint64_t> offsets_, numels_;
  std::uint64_t total_ = 0, shard_ = 0;
  int world_ = 1;
};

// Buckets cut from the end of the layout backwards (the order backward
// completes gradients), on parameter boundaries and wherever the module
// that completes the gradients changes, so a bucket is ready as soon as
// one module's backward is done: the first holds about first_elements, the
// others about bucket_elements (a parameter larger than that gets a bucket
// of its own); the last one reaches down to element 0. bucket_of receives
// each parameter's bucket.
ZTRAIN_API IdVector<BucketId, BucketRange> reverse_buckets(const FlatLayout& layout,
                                                           const ParamSpecs& params,
                                                           std::uint64_t bucket_elements,
                                                           std::uint64_t first_elements,
                                                           IdVector<ParamId, BucketId>& bucket_of);

// For each module, the parameters whose gradient is complete after that
// module's backward: those whose lowest-numbered user it is (backward runs
// from the last module to the first); unused parameters count for module 0.
ZTRAIN_API IdVector<ModuleId, std::vector<ParamId>> completed_by_module(const ParamSpecs& params);

}  // namespace ztrain::shard
