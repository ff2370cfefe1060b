// The benchmarks' timing helpers: the median of a set of runs (robust to a
// noisy neighbour taking one of them) and the wall time of one call.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace ztrain::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds f() took.
template <class F>
double timed(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace ztrain::bench
