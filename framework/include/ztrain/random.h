// Counter-based randomness for reproducible, shard-independent streams.
//
// Every random value ztrain draws is a pure function of (seed, stream,
// index): a parameter element's initial value does not depend on which rank
// initialises it, and a data sequence does not depend on who reads it.
// `Permutation` is a bijection of [0, n) keyed by a seed (a Feistel network
// with cycle walking), for shuffling without storing a table.
//
// Thread safety: pure functions and immutable objects.
#pragma once

#include <cmath>
#include <cstdint>

namespace ztrain {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline std::uint64_t hash_combine(std::uint64_t a, std::uint64_t b) {
  return splitmix64(a ^ splitmix64(b + 0x632be59bd9b4e019ull));
}

// Uniform in (0, 1): never 0, so log() is safe.
inline double uniform_open(std::uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal for element `index` of stream `stream` under `seed`
// (Box-Muller on two independent draws).
inline double normal_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t base = hash_combine(hash_combine(seed, stream), index);
  const double u1 = uniform_open(splitmix64(base));
  const double u2 = uniform_open(splitmix64(base ^ 0xd1b54a32d192ed03ull));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Uniform in (-1, 1) for element `index` of stream `stream` under `seed`
// (a stream of its own: not a normal_at draw reused).
inline double symmetric_uniform_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t base = hash_combine(hash_combine(seed, stream), index);
  return 2.0 * uniform_open(splitmix64(base ^ 0x8cb92ba72f3d8dd7ull)) - 1.0;
}

class Permutation {
 public:
  Permutation(std::uint64_t n, std::uint64_t seed) : n_(n), seed_(seed) {
    bits_ = 2;
    while ((1ull << bits_) < n_) bits_ += 2;
    half_ = bits_ / 2;
  }
  std::uint64_t operator()(std::uint64_t i) const {
    std::uint64_t x = i;
    do x = encrypt(x);
    while (x >= n_);
    return x;
  }

 private:
  std::uint64_t encrypt(std::uint64_t x) const {
    const std::uint64_t mask = (1ull << half_) - 1;
    std::uint64_t l = x >> half_, r = x & mask;
    for (std::uint64_t round = 0; round < 4; ++round) {
      const std::uint64_t f = hash_combine(seed_ + round, r) & mask;
      const std::uint64_t nl = r;
      r = l ^ f;
      l = nl;
    }
    return (l << half_) | r;
  }
  std::uint64_t n_, seed_;
  unsigned bits_, half_;
};

}  // namespace ztrain
