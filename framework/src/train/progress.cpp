#include "train/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>

namespace ztrain {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  const long total = std::lround(s);
  if (total >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", total / 3600, (total / 60) % 60);
  else if (total >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", total / 60, total % 60);
  else
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

std::string format_rate(double r) {
  char buf[32];
  if (r >= 1e12)
    std::snprintf(buf, sizeof buf, "%.2fT", r / 1e12);
  else if (r >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fG", r / 1e9);
  else if (r >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", r / 1e6);
  else if (r >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", r / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", r);
  return buf;
}

bool Progress::on_terminal() {
  if (const char* launcher = std::getenv("ZTRAIN_TERMINAL")) return std::string(launcher) == "1";
  return isatty(STDERR_FILENO) == 1;
}

Progress::Progress(std::int64_t total_steps, bool enabled)
    : total_(total_steps),
      enabled_(enabled),
      tty_(enabled && on_terminal()),
      bar_out_(isatty(STDERR_FILENO) == 1 ? stderr : stdout) {}

void Progress::clear() {
  if (drawn_) {
    std::fputs("\r\033[2K", bar_out_);
    std::fflush(bar_out_);
    drawn_ = false;
  }
}

void Progress::draw() {
  std::fputs(("\r\033[2K" + bar_).c_str(), bar_out_);
  std::fflush(bar_out_);
  drawn_ = true;
}

void Progress::update(std::int64_t step, double loss, double tokens_per_s, double elapsed_s) {
  if (!tty_) return;
  constexpr int kWidth = 24;
  const double frac = total_ > 0 ? static_cast<double>(step) / static_cast<double>(total_) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(kWidth, '.');
  const double eta =
      step > 0 ? elapsed_s / static_cast<double>(step) * static_cast<double>(total_ - step) : NAN;
  char text[256];
  std::snprintf(text, sizeof text, "[%s] %lld/%lld  loss %.4f  %s tok/s  ETA %s", bar.c_str(),
                static_cast<long long>(step), static_cast<long long>(total_), loss,
                format_rate(tokens_per_s).c_str(), format_duration(eta).c_str());
  bar_ = text;
  draw();
}

void Progress::line(const std::string& text) {
  if (!enabled_) return;
  clear();
  std::fprintf(stdout, "%s\n", text.c_str());
  std::fflush(stdout);
  if (tty_ && !bar_.empty()) draw();
}

void Progress::finish() {
  clear();
  bar_.clear();
}

}  // namespace ztrain
