// Progress: what the user watches. On a terminal, one status line redrawn
// in place (step/total, loss, tokens/s, ETA); otherwise a plain line per
// logged step, so logs stay readable.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ztrain {

class Progress {
 public:
  // Disabled (other ranks than 0), it prints nothing.
  Progress(std::int64_t total_steps, bool enabled);
  // Redraws the bar (terminal only).
  void update(std::int64_t step, double loss, double tokens_per_s, double elapsed_s);
  // A line that must stay on screen (logged steps off a terminal, evals, warnings).
  void line(const std::string& text);
  void finish();
  bool is_terminal() const { return tty_; }

 private:
  void clear();
  std::int64_t total_;
  bool enabled_, tty_;
  bool drawn_ = false;
};

std::string format_duration(double seconds);
std::string format_rate(double per_s);

}  // namespace ztrain
