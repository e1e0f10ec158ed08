// Output for the evaluation commands: markdown/CSV tables, an SVG line plot
// (written by hand, no dependencies) and a progress bar on stderr.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ptllm::eval {

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;  // each row has header.size() cells
  // GitHub markdown; cells are escaped for '|'.
  std::string markdown() const;
  // RFC 4180: cells with ',', '"' or newlines are quoted.
  std::string csv() const;
};

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), x increasing
};

struct PlotSpec {
  std::string title, x_label, y_label;
  int width = 900, height = 520;
  // Log scale on y when the data spans more than this ratio (max/min); 0 = never.
  double log_y_above_ratio = 8.0;
};

// A standalone SVG document: axes with ticks, one polyline per series, legend.
// Non-finite or non-positive y values (on a log axis) are skipped.
std::string svg_line_plot(const std::vector<Series>& series, const PlotSpec& spec);

// Writes `text` to `path`, throwing Error naming the path on failure.
void write_file(const std::string& path, const std::string& text);

// "12.3 s", "4 min 05 s".
std::string format_duration(double seconds);

// A one-line progress bar on stderr: label, bar, done/total, tokens/s, ETA.
// Stays silent for the first second (short runs print nothing); redraws at
// most every 0.2 s on a terminal, or prints a line every 10 s otherwise.
class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled = true);
  ~Progress();
  void add(int64_t n);
  void finish();  // clears/ends the line; called by the destructor too

 private:
  void draw(bool final_line);
  using clock = std::chrono::steady_clock;
  std::string label_;
  int64_t total_, done_ = 0;
  bool enabled_, tty_, shown_ = false, finished_ = false;
  clock::time_point start_, last_draw_;
};

}  // namespace ptllm::eval
