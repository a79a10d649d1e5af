#include "sim/progress.hpp"

#include <algorithm>
#include <cstdio>

namespace tessera::sim {

std::string per_second(double rate) {
  char text[32];
  std::snprintf(text, sizeof text, rate >= 10 ? "%.0f" : rate >= 1 ? "%.1f" : "%.2g", rate);
  return text;
}

void Progress::update(const std::string& phase, const std::string& what, std::size_t done,
                      std::size_t total, const std::string& last, bool notable) {
  const Clock::time_point now = Clock::now();
  if (!open_ || phase != phase_ || what != what_) {
    if (open_ && terminal_) err_ << "\n";  // the previous phase ended without its last item
    phase_ = phase;
    what_ = what;
    started_ = printed_ = now;
    printed_tenth_ = 0;
    open_ = true;
  }
  const bool finished = done >= total;
  total = std::max<std::size_t>(total, 1);
  const double elapsed = std::chrono::duration<double>(now - started_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
  const double eta = done > 0 ? elapsed * static_cast<double>(total - std::min(done, total)) /
                                    static_cast<double>(done)
                              : 0;
  const std::string label = what.empty() ? phase : phase + " " + what;
  char text[256];
  if (notable) {
    // Its own line; on a terminal the bar goes on below it.
    err_ << (terminal_ ? "\n" : "") << done << "/" << total << " " << label << ": " << last << "\n"
         << std::flush;
    printed_ = now;
  }
  if (terminal_) {
    // Redrawn at most 10 times a second, and when the phase ends.
    if (!finished && now - printed_ < std::chrono::milliseconds(100) && done > 1) return;
    printed_ = now;
    const std::size_t width = 24, filled = width * std::min(done, total) / total;
    std::snprintf(text, sizeof text, "\r[%s%s] %zu/%zu %s, %s/s, %s %.0f s   ",
                  std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done,
                  total, label.c_str(), per_second(rate).c_str(), finished ? "took" : "ETA",
                  finished ? elapsed : eta);
    err_ << text << (finished ? "\n" : "") << std::flush;
  } else {
    // A line per tenth once the phase has run 2 s (quick phases get their closing line only),
    // and at least one every 10 s.
    const std::size_t tenth = 10 * std::min(done, total) / total;
    const bool next_tenth = tenth > printed_tenth_ && elapsed >= 2;
    if (!finished && !next_tenth && now - printed_ < std::chrono::seconds(10)) return;
    printed_ = now;
    printed_tenth_ = tenth;
    if (finished)
      std::snprintf(text, sizeof text, "%zu %s in %.1f s (%s/s)", done, label.c_str(), elapsed,
                    per_second(rate).c_str());
    else
      std::snprintf(text, sizeof text, "%zu/%zu %s, %.1f s elapsed, %s/s, ETA %.0f s", done, total,
                    label.c_str(), elapsed, per_second(rate).c_str(), eta);
    err_ << text << (last.empty() ? "" : "; last: " + last) << "\n" << std::flush;
  }
  if (finished) open_ = false;
}

}  // namespace tessera::sim
