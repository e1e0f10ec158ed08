#include "eval/report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/error.h"

namespace ptllm::eval {

// ---- Tables ----------------------------------------------------------------

std::string Table::markdown() const {
  auto esc = [](const std::string& s) {
    std::string o;
    for (char c : s) {
      if (c == '|') o += "\\|";
      else if (c == '\n') o += ' ';
      else o += c;
    }
    return o;
  };
  std::string out = "|";
  for (const auto& h : header) out += " " + esc(h) + " |";
  out += "\n|";
  for (size_t i = 0; i < header.size(); ++i) out += i == 0 ? " --- |" : " ---: |";
  out += "\n";
  for (const auto& row : rows) {
    out += "|";
    for (const auto& c : row) out += " " + esc(c) + " |";
    out += "\n";
  }
  return out;
}

std::string Table::csv() const {
  auto cell = [](const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string o = "\"";
    for (char c : s) {
      if (c == '"') o += '"';
      o += c;
    }
    return o + "\"";
  };
  auto line = [&](const std::vector<std::string>& cells) {
    std::string o;
    for (size_t i = 0; i < cells.size(); ++i) o += (i ? "," : "") + cell(cells[i]);
    return o + "\n";
  };
  std::string out = line(header);
  for (const auto& r : rows) out += line(r);
  return out;
}

// ---- SVG plot --------------------------------------------------------------

namespace {

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

// "Nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks.
double nice_step(double span, int target) {
  const double raw = span / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

std::string tick_label(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e5 || a < 1e-2) return fmt::format("{:.0e}", v);
  if (a >= 100 || std::fabs(v - std::round(v)) < 1e-9) return fmt::format("{:.0f}", v);
  return fmt::format("{:.3g}", v);
}

// Colour-blind-friendly palette (Okabe–Ito) then a few extras.
const char* kColors[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
                         "#000000", "#F0E442", "#7F3C8D", "#11A579", "#3969AC", "#E73F74"};
const char* kDashes[] = {"", "6,3", "2,3", "8,3,2,3"};

}  // namespace

std::string svg_line_plot(const std::vector<Series>& series, const PlotSpec& spec) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& s : series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || y <= 0) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 1, y1 = 10;
  if (x1 <= x0) x1 = x0 + 1;
  const bool log_y = spec.log_y_above_ratio > 0 && y1 / y0 > spec.log_y_above_ratio;
  auto fy = [&](double y) { return log_y ? std::log10(y) : y; };
  double ly0 = fy(y0), ly1 = fy(y1);
  if (!log_y) ly0 = std::min(0.0, ly0);  // linear perplexity axes start at 0
  if (ly1 <= ly0) ly1 = ly0 + 1;
  const double pad = (ly1 - ly0) * 0.05;
  if (log_y) ly0 -= pad;
  ly1 += pad;

  const double L = 80, R = 24, T = 44, B = 58;
  const double legend_h = 18.0 * double(series.size()) + 12;
  const double W = spec.width, H = spec.height + legend_h;
  const double pw = W - L - R, ph = spec.height - T - B;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return T + (1 - (fy(y) - ly0) / (ly1 - ly0)) * ph; };

  std::string o;
  o += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      W, H);
  o += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", W, H);
  o += fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n", W / 2,
                   xml_escape(spec.title));
  // Grid and ticks.
  const double xs = nice_step(x1 - x0, 8);
  for (double x = std::ceil(x0 / xs) * xs; x <= x1 + 1e-9; x += xs) {
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>\n", px(x), T,
                     T + ph);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", px(x), T + ph + 16,
                     tick_label(x));
  }
  std::vector<double> yticks;
  if (log_y) {
    for (double d = std::floor(ly0); d <= ly1; d += 1)
      for (double m : {1.0, 2.0, 5.0}) {
        const double v = m * std::pow(10.0, d);
        if (std::log10(v) >= ly0 && std::log10(v) <= ly1) yticks.push_back(v);
      }
  } else {
    const double ys = nice_step(ly1 - ly0, 6);
    for (double y = std::ceil(ly0 / ys) * ys; y <= ly1 + 1e-9; y += ys) yticks.push_back(y);
  }
  for (double y : yticks) {
    if (log_y ? y <= 0 : false) continue;
    const double yy = log_y ? py(y) : T + (1 - (y - ly0) / (ly1 - ly0)) * ph;
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>\n", L, yy,
                     L + pw);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", L - 6, yy + 4, tick_label(y));
  }
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", L, T, pw, ph);
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", L + pw / 2, T + ph + 38,
                   xml_escape(spec.x_label));
  o += fmt::format(
      "<text transform=\"translate(18,{:.1f}) rotate(-90)\" text-anchor=\"middle\">{}{}</text>\n", T + ph / 2,
      xml_escape(spec.y_label), log_y ? " (log scale)" : "");
  // Series.
  for (size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % std::size(kColors)];
    const char* dash = kDashes[(i / std::size(kColors)) % std::size(kDashes)];
    std::string pts;
    for (auto [x, y] : series[i].points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (log_y && y <= 0)) continue;
      pts += fmt::format("{:.1f},{:.1f} ", px(x), std::clamp(py(y), T, T + ph));
    }
    o += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\"{} points=\"{}\"/>\n", color,
                     *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "", pts);
    const double ly = spec.height + 18.0 * double(i);
    o += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"2.5\"{4}/>\n", L,
                     ly, L + 28, color, *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "");
    o += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", L + 36, ly + 4, xml_escape(series[i].name));
  }
  o += "</svg>\n";
  return o;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open for writing", path);
  f << text;
  f.close();
  if (!f) fail("{}: write failed", path);
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) return fmt::format("{:.1f} s", s);
  const auto t = int64_t(s + 0.5);
  if (t < 3600) return fmt::format("{} min {:02d} s", t / 60, t % 60);
  return fmt::format("{} h {:02d} min", t / 3600, (t % 3600) / 60);
}

// ---- Progress --------------------------------------------------------------

Progress::Progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0) {
  start_ = last_draw_ = clock::now();
}

Progress::~Progress() { finish(); }

void Progress::add(int64_t n) {
  done_ += n;
  if (!enabled_) return;
  const auto now = clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (elapsed < 1.0) return;
  const double since_draw = std::chrono::duration<double>(now - last_draw_).count();
  if (shown_ && since_draw < (tty_ ? 0.2 : 10.0)) return;
  draw(false);
}

void Progress::draw(bool final_line) {
  const auto now = clock::now();
  last_draw_ = now;
  shown_ = true;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? double(done_) / elapsed : 0;
  const double frac = total_ > 0 ? std::min(1.0, double(done_) / double(total_)) : 0;
  const double eta = rate > 0 ? double(total_ - done_) / rate : NAN;
  std::string line;
  if (tty_) {
    const int width = 24, fill = int(frac * width + 0.5);
    line = fmt::format("\r{} [{}{}] {}/{} tok · {:.0f} tok/s · {} {}\x1b[K", label_, std::string(size_t(fill), '#'),
                       std::string(size_t(width - fill), '.'), done_, total_, rate,
                       final_line ? "took" : "ETA", format_duration(final_line ? elapsed : eta));
    if (final_line) line += "\n";
  } else {
    line = fmt::format("{}: {}/{} tok ({:.0f}%) · {:.0f} tok/s · {} {}\n", label_, done_, total_, frac * 100, rate,
                       final_line ? "took" : "ETA", format_duration(final_line ? elapsed : eta));
  }
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_ && shown_) draw(true);
}

}  // namespace ptllm::eval
