// Progress: what the user watches. On a terminal, one status line redrawn
// in place (step/total, loss, tokens/s, ETA) below the lines that stay (a
// line per printed step, evaluations, notes): a line clears the bar,
// prints, and draws the bar again, so history stays on screen. Off a
// terminal, only the plain lines, so logs stay readable.
//
// Under a launcher (`--nproc`, `--hostfile`: mpirun) rank 0's output is a
// pipe; the launcher says whether its own stdout and stderr are a terminal
// in ZTRAIN_TERMINAL (1 or 0), and rank 0 then draws the bar on stdout, the
// stream its lines take, so that mpirun forwards the two in order.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ztrain {

class Progress {
 public:
  // Disabled (other ranks than 0), it prints nothing.
  Progress(std::int64_t total_steps, bool enabled);
  // Whether the bar is drawn: stderr is a terminal, or ZTRAIN_TERMINAL says
  // the launcher's output is one.
  static bool on_terminal();
  // Redraws the bar (terminal only).
  void update(std::int64_t step, double loss, double tokens_per_s, double elapsed_s);
  // A line that must stay on screen (logged steps off a terminal, evals, warnings).
  void line(const std::string& text);
  void finish();
  bool is_terminal() const { return tty_; }

 private:
  void clear();
  void draw();
  std::int64_t total_;
  bool enabled_, tty_;
  std::FILE* bar_out_;  // stderr on a terminal, stdout under a launcher
  std::string bar_;     // the last bar drawn, drawn again below a line
  bool drawn_ = false;
};

std::string format_duration(double seconds);
std::string format_rate(double per_s);

}  // namespace ztrain
