// synthetic: a seeded Markov source whose entropy rate is known exactly.
//
// Token x is followed by (sigma(x) + o_k) mod V, where sigma is a seeded
// permutation of the vocabulary, the offsets o_k = k * floor(V/K) are
// distinct, and k is drawn with probability p_k proportional to
// 1/(k+1)^skew. The K successors of every token are distinct and the chain's
// transition matrix is doubly stochastic, so with a uniform first token
// every position is uniform and the entropy of each next token given the
// previous one is exactly H(p). A model that learns the chain reaches a loss
// of H(p) nats per token and cannot go lower.
//
// With masked_prefix = M, each sequence's first k targets are
// kIgnoreTarget, k drawn per sequence from 0..M (as a fine-tuning
// example's prompt, which the loss skips): the trained tokens differ from
// row to row, so a loss normalised per micro-batch or per rank instead of
// over the global batch's trained tokens shows. The tokens themselves, and
// the entropy rate of the trained ones, are unchanged.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "ztrain/data.h"
#include "ztrain/error.h"
#include "ztrain/random.h"

namespace {

using namespace ztrain;

class Synthetic final : public DataSource {
 public:
  explicit Synthetic(const Options& o)
      : vocab_option_(static_cast<int>(o.get_int("vocab_size"))),
        branching_(static_cast<int>(o.get_int("branching"))),
        skew_(o.get_number("skew")),
        masked_prefix_(static_cast<int>(o.get_int("masked_prefix"))),
        where_(o.where("branching")) {}

  static void declare_options(OptionList& o) {
    o.integer("vocab_size", 0, "tokens the source uses; 0 = the model's vocab_size")
        .at_least(0)
        .as_int();
    o.integer("branching", 4, "successors per token (K)").at_least(1).at_most(1024);
    o.number("skew", 1.0, "successor k has probability proportional to 1/(k+1)^skew").at_least(0);
    o.integer("masked_prefix", 0,
              "mask the first k targets of each sequence (a prompt the loss skips), k drawn per "
              "sequence from 0 to this; 0: every target is trained")
        .at_least(0)
        .as_int();
  }

  void setup(const DataSetup& s) override {
    V_ = vocab_option_ ? vocab_option_ : s.vocab_size;
    T_ = s.seq_len;
    seed_ = s.seed;
    if (branching_ > V_)
      throw ConfigError(where_ + ": [data] branching (" + std::to_string(branching_) +
                        ") exceeds the vocabulary (" + std::to_string(V_) + ")");
    // Evaluated per token, not tabulated: a table of V entries would be
    // memory outside the device's accounting, as large as the vocabulary.
    sigma_.emplace(static_cast<std::uint64_t>(V_), hash_combine(seed_, 0x5167));
    std::vector<double> w(static_cast<std::size_t>(branching_));
    double total = 0;
    for (int k = 0; k < branching_; ++k)
      total += w[static_cast<std::size_t>(k)] = 1.0 / std::pow(k + 1.0, skew_);
    cdf_.clear();
    entropy_ = 0;
    double acc = 0;
    for (double wk : w) {
      const double p = wk / total;
      entropy_ -= p * std::log(p);
      acc += p;
      cdf_.push_back(acc);
    }
    cdf_.back() = 1.0;
    stride_ = V_ / branching_;
  }

  DataInfo info() const override {
    return {"synthetic (V=" + std::to_string(V_) + ", K=" + std::to_string(branching_) + ")",
            entropy_,
            V_,
            {},            // no files: every rank computes the same tokens
            std::nullopt,  // endless
            std::nullopt,
            {},  // no tokenizer made these ids
            {},
            std::nullopt,
            masked_prefix_ > 0};
  }

  void fill(Split split, std::uint64_t index, std::int32_t* inputs,
            std::int32_t* targets) const override {
    const std::uint64_t stream =
        hash_combine(hash_combine(seed_, split == Split::train ? 1 : 2), index);
    int x = static_cast<int>(splitmix64(stream) % static_cast<std::uint64_t>(V_));
    for (int t = 0; t < T_; ++t) {
      inputs[t] = x;
      const double u = uniform_open(hash_combine(stream, static_cast<std::uint64_t>(t) + 1));
      int k = 0;
      while (k + 1 < branching_ && u > cdf_[static_cast<std::size_t>(k)]) ++k;
      x = static_cast<int>(((*sigma_)(static_cast<std::uint64_t>(x)) +
                            static_cast<std::uint64_t>(k) * static_cast<std::uint64_t>(stride_)) %
                           static_cast<std::uint64_t>(V_));
      targets[t] = x;
    }
    if (masked_prefix_ == 0) return;
    const auto k = static_cast<int>(hash_combine(stream, 0x6d61736b) %
                                    static_cast<std::uint64_t>(masked_prefix_ + 1));
    std::fill(targets, targets + std::min(k, T_), kIgnoreTarget);
  }

 private:
  int vocab_option_, branching_;
  double skew_;
  int masked_prefix_;
  std::string where_;
  int V_ = 0, T_ = 0, stride_ = 1;
  std::uint64_t seed_ = 0;
  std::optional<Permutation> sigma_;  // token x's first successor
  std::vector<double> cdf_;
  double entropy_ = 0;
};

}  // namespace

ZTRAIN_PLUGIN("data", "synthetic", "0.1.0",
              "seeded Markov source with a known entropy rate (the default)", Synthetic)
