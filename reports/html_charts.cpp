// Inline SVG charts for the reports (html.hpp): four chart kinds drawn on one frame (title,
// legend, axes with nice ticks). Coordinates are SVG user units (px); values are the caller's
// units, named in the axis labels. The page and tables are in html.cpp.
#include "html.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace stepcast::html {
namespace {

const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                                "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

const char* color(size_t index) { return kPalette[index % (sizeof(kPalette) / sizeof(kPalette[0]))]; }

std::string number(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f", value);
  return buffer;
}

bool is_power_of_two(double value) {
  if (!(value > 0)) return false;
  double exponent = std::log2(value);
  return std::fabs(exponent - std::round(exponent)) < 1e-9;
}

// One axis: maps values in [low, high] (log10 or log2 space when log) onto [px_low, px_high].
struct Axis {
  double low = 0;
  double high = 1;
  bool log = false;
  bool base2 = false;
  double px_low = 0;
  double px_high = 1;

  double transform(double value) const {
    if (!log) return value;
    return base2 ? std::log2(value) : std::log10(value);
  }
  double map(double value) const {
    double a = transform(low), b = transform(high), v = transform(value);
    if (b == a) return (px_low + px_high) / 2;
    return px_low + (v - a) / (b - a) * (px_high - px_low);
  }
  std::vector<double> ticks() const {
    if (!log) return nice_ticks(low, high);
    std::vector<double> result;
    double base = base2 ? 2 : 10;
    int first = static_cast<int>(std::floor(transform(low) + 1e-9));
    int last = static_cast<int>(std::ceil(transform(high) - 1e-9));
    int step = std::max(1, (last - first) / 8 + 1);
    for (int e = first; e <= last; e += step) {
      double value = std::pow(base, e);
      if (value >= low * (1 - 1e-9) && value <= high * (1 + 1e-9)) result.push_back(value);
    }
    if (result.empty()) result = {low, high};
    return result;
  }
};

// The range of finite (and, on log axes, positive) values, widened so it is never empty.
Axis make_axis(std::vector<double> values, bool log, bool include_zero) {
  Axis axis;
  axis.log = log;
  std::vector<double> usable;
  for (double v : values)
    if (std::isfinite(v) && (!log || v > 0)) usable.push_back(v);
  if (usable.empty()) usable = log ? std::vector<double>{1, 10} : std::vector<double>{0, 1};
  auto [lo, hi] = std::minmax_element(usable.begin(), usable.end());
  axis.low = *lo;
  axis.high = *hi;
  if (log) {
    axis.base2 = std::all_of(usable.begin(), usable.end(), is_power_of_two);
    double base = axis.base2 ? 2 : 10;
    axis.low = std::pow(base, std::floor(axis.transform(axis.low) + 1e-9));
    axis.high = std::pow(base, std::ceil(axis.transform(axis.high) - 1e-9));
    if (axis.high <= axis.low) axis.high = axis.low * base;
    return axis;
  }
  if (include_zero) {
    axis.low = std::min(axis.low, 0.0);
    axis.high = std::max(axis.high, 0.0);
  }
  if (axis.high <= axis.low) {
    double pad = axis.low == 0 ? 1 : std::fabs(axis.low) * 0.1;
    axis.low -= pad;
    axis.high += pad;
  }
  std::vector<double> ticks = nice_ticks(axis.low, axis.high);
  axis.low = std::min(axis.low, ticks.front());
  axis.high = std::max(axis.high, ticks.back());
  return axis;
}

// The frame every chart shares: plot area, title, axis labels, ticks and grid, legend.
struct Frame {
  const ChartOptions& options;
  double left = 78, right = 16, top = 52, bottom = 58;
  std::ostringstream svg;

  // Legend entries wrap onto rows inside the chart's width; the plot starts below them.
  std::vector<std::string> legend_names;
  std::vector<std::pair<double, double>> legend_xy;

  Frame(const ChartOptions& o, const std::vector<std::string>& names = {})
      : options(o), legend_names(names) {
    double x = left, y = 30;
    for (const auto& name : names) {
      double width = 24 + 6.5 * static_cast<double>(name.size());
      if (x > left && x + width > o.width_px - right) {
        x = left;
        y += 15;
      }
      legend_xy.emplace_back(x, y);
      x += width;
    }
    top = names.empty() ? 40 : y + 22;
    // A title wider than the chart is set smaller rather than clipped.
    double title_px = 8.6 * static_cast<double>(o.title.size());
    double title_font = std::max(9.0, std::min(15.0, 15.0 * (o.width_px - 8) / std::max(1.0, title_px)));
    svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"" << o.width_px
        << "\" height=\"" << o.height_px << "\" viewBox=\"0 0 " << o.width_px << ' '
        << o.height_px << "\" role=\"img\" aria-label=\"" << escape(o.title) << "\">\n";
    svg << "<rect x=\"0\" y=\"0\" width=\"" << o.width_px << "\" height=\"" << o.height_px
        << "\" fill=\"#fff\"/>\n";
    svg << "<text x=\"" << o.width_px / 2 << "\" y=\"20\" text-anchor=\"middle\" "
        << "font-size=\"" << number(title_font) << "\" font-weight=\"bold\">" << escape(o.title)
        << "</text>\n";
  }
  double plot_left() const { return left; }
  double plot_right() const { return options.width_px - right; }
  double plot_top() const { return top; }
  double plot_bottom() const { return options.height_px - bottom; }

  void legend() {
    for (size_t i = 0; i < legend_names.size(); ++i) {
      auto [x, y] = legend_xy[i];
      svg << "<rect class=\"legend\" x=\"" << number(x) << "\" y=\"" << number(y)
          << "\" width=\"10\" height=\"10\" fill=\"" << color(i) << "\"/><text x=\""
          << number(x + 14) << "\" y=\"" << number(y + 9) << "\" font-size=\"11\">"
          << escape(legend_names[i]) << "</text>\n";
    }
  }

  void x_axis_ticks(const Axis& axis) {
    for (double t : axis.ticks()) {
      double px = axis.map(t);
      svg << "<line x1=\"" << number(px) << "\" y1=\"" << number(plot_top()) << "\" x2=\""
          << number(px) << "\" y2=\"" << number(plot_bottom()) << "\" stroke=\"#e5e5e5\"/>\n"
          << "<text x=\"" << number(px) << "\" y=\"" << number(plot_bottom() + 16)
          << "\" text-anchor=\"middle\" font-size=\"11\">" << format_tick(t) << "</text>\n";
    }
  }
  void x_category_labels(const std::vector<std::string>& categories, const Axis& slots) {
    bool rotate = categories.size() > 6;
    for (size_t i = 0; i < categories.size(); ++i) {
      double px = slots.map(static_cast<double>(i) + 0.5);
      double py = plot_bottom() + 14;
      svg << "<text x=\"" << number(px) << "\" y=\"" << number(py) << "\" font-size=\"10\" "
          << (rotate ? "text-anchor=\"end\" transform=\"rotate(-30 " + number(px) + ' ' +
                           number(py) + ")\""
                     : std::string("text-anchor=\"middle\""))
          << ">" << escape(categories[i]) << "</text>\n";
    }
  }
  void y_axis_ticks(const Axis& axis) {
    for (double t : axis.ticks()) {
      double py = axis.map(t);
      svg << "<line x1=\"" << number(plot_left()) << "\" y1=\"" << number(py) << "\" x2=\""
          << number(plot_right()) << "\" y2=\"" << number(py) << "\" stroke=\"#e5e5e5\"/>\n"
          << "<text x=\"" << number(plot_left() - 6) << "\" y=\"" << number(py + 4)
          << "\" text-anchor=\"end\" font-size=\"11\">" << format_tick(t) << "</text>\n";
    }
  }
  void axis_lines_and_labels() {
    svg << "<rect x=\"" << number(plot_left()) << "\" y=\"" << number(plot_top())
        << "\" width=\"" << number(plot_right() - plot_left()) << "\" height=\""
        << number(plot_bottom() - plot_top()) << "\" fill=\"none\" stroke=\"#333\"/>\n";
    svg << "<text x=\"" << number((plot_left() + plot_right()) / 2) << "\" y=\""
        << options.height_px - 6 << "\" text-anchor=\"middle\" font-size=\"12\">"
        << escape(options.x_label) << "</text>\n";
    double cy = (plot_top() + plot_bottom()) / 2;
    svg << "<text x=\"14\" y=\"" << number(cy) << "\" text-anchor=\"middle\" font-size=\"12\" "
        << "transform=\"rotate(-90 14 " << number(cy) << ")\">" << escape(options.y_label)
        << "</text>\n";
  }
  void note(const std::string& text) {
    svg << "<text x=\"" << number(plot_right() - 4) << "\" y=\"" << number(plot_top() + 14)
        << "\" text-anchor=\"end\" font-size=\"11\" fill=\"#a00\">" << escape(text) << "</text>\n";
  }
  std::string finish() {
    svg << "</svg>\n";
    return svg.str();
  }
};

}  // namespace

std::vector<double> nice_ticks(double low, double high, int max_ticks) {
  if (!std::isfinite(low) || !std::isfinite(high)) return {0, 1};
  if (high < low) std::swap(low, high);
  if (high == low) return {low};
  double raw = (high - low) / std::max(1, max_ticks - 1);
  double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  double first = std::floor(low / step + 1e-9) * step;
  for (double t = first; t <= high + step * (1 - 1e-9); t += step) {
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0 : t);
    if (ticks.size() > 100) break;
  }
  return ticks;
}

std::string format_tick(double value) {
  char buffer[32];
  double magnitude = std::fabs(value);
  if (magnitude != 0 && (magnitude >= 1e6 || magnitude < 1e-3))
    std::snprintf(buffer, sizeof buffer, "%.3g", value);
  else
    std::snprintf(buffer, sizeof buffer, "%.4g", value);
  return buffer;
}

std::string scatter_chart(const ChartOptions& options, const std::vector<Point>& points,
                          double band_fraction) {
  Frame frame(options);
  std::vector<double> xs, ys;
  size_t dropped = 0;
  // A point is drawn when both values are finite (and positive on a log axis).
  auto drawable = [&options](const Point& p) {
    return std::isfinite(p.x) && std::isfinite(p.y) && (!options.log_x || p.x > 0) &&
           (!options.log_y || p.y > 0);
  };
  for (const auto& p : points) {
    if (!drawable(p)) { ++dropped; continue; }
    xs.push_back(p.x);
    ys.push_back(p.y);
  }
  Axis x_axis, y_axis;
  if (band_fraction > 0) {
    // One range for both axes so the diagonal is the diagonal; the band must fit too.
    std::vector<double> all = xs;
    all.insert(all.end(), ys.begin(), ys.end());
    std::vector<double> widened = all;
    for (double v : all) widened.push_back(v * (1 + band_fraction));
    x_axis = make_axis(widened, options.log_x, !options.log_x);
    y_axis = x_axis;
  } else {
    x_axis = make_axis(xs, options.log_x, false);
    y_axis = make_axis(ys, options.log_y, false);
  }
  x_axis.px_low = frame.plot_left();
  x_axis.px_high = frame.plot_right();
  y_axis.px_low = frame.plot_bottom();
  y_axis.px_high = frame.plot_top();
  frame.x_axis_ticks(x_axis);
  frame.y_axis_ticks(y_axis);
  if (band_fraction > 0) {
    // The band between y = (1 − f)x and y = (1 + f)x, sampled so it is right on log axes too.
    const int samples = 32;
    std::ostringstream upper, lower;
    for (int i = 0; i <= samples; ++i) {
      double t = static_cast<double>(i) / samples;
      double x = options.log_x
                     ? std::pow(10, std::log10(x_axis.low) +
                                        t * (std::log10(x_axis.high) - std::log10(x_axis.low)))
                     : x_axis.low + t * (x_axis.high - x_axis.low);
      double hi = std::min(x * (1 + band_fraction), y_axis.high);
      double lo = std::max(x * (1 - band_fraction), y_axis.low);
      upper << number(x_axis.map(x)) << ',' << number(y_axis.map(hi)) << ' ';
      lower.str(number(x_axis.map(x)) + ',' + number(y_axis.map(lo)) + ' ' + lower.str());
    }
    frame.svg << "<polygon class=\"band\" points=\"" << upper.str() << lower.str()
              << "\" fill=\"#4e79a7\" fill-opacity=\"0.12\" stroke=\"none\"><title>±"
              << number(band_fraction * 100) << "%</title></polygon>\n";
    frame.svg << "<line class=\"diagonal\" x1=\"" << number(x_axis.map(x_axis.low)) << "\" y1=\""
              << number(y_axis.map(x_axis.low)) << "\" x2=\"" << number(x_axis.map(x_axis.high))
              << "\" y2=\"" << number(y_axis.map(x_axis.high))
              << "\" stroke=\"#4e79a7\" stroke-dasharray=\"4 3\"/>\n";
  }
  for (const auto& p : points) {
    if (!drawable(p)) continue;
    double px = x_axis.map(p.x), py = y_axis.map(p.y);
    frame.svg << "<circle class=\"point\" cx=\"" << number(px) << "\" cy=\"" << number(py)
              << "\" r=\"4\" fill=\"" << color(1) << "\"><title>" << escape(p.label) << " ("
              << format_tick(p.x) << ", " << format_tick(p.y) << ")</title></circle>\n";
    // Many points crowd their labels: then only those outside the band are named (all of them
    // keep their tooltip).
    bool outside = band_fraction > 0 && std::fabs(p.y / p.x - 1) > band_fraction;
    if (!p.label.empty() && (points.size() <= 12 || outside))
      frame.svg << "<text x=\"" << number(px + 6) << "\" y=\"" << number(py - 5)
                << "\" font-size=\"9\" fill=\"#555\">" << escape(p.label) << "</text>\n";
  }
  if (xs.empty()) frame.note("no data");
  else if (dropped > 0) frame.note(std::to_string(dropped) + " point(s) without a value left out");
  frame.axis_lines_and_labels();
  return frame.finish();
}

std::string line_chart(const ChartOptions& options, const std::vector<Line>& lines) {
  std::vector<std::string> names;
  for (const auto& line : lines) names.push_back(line.name);
  Frame frame(options, names);
  std::vector<double> xs, ys;
  for (const auto& line : lines) {
    for (size_t i = 0; i < std::min(line.x.size(), line.y.size()); ++i) {
      xs.push_back(line.x[i]);
      ys.push_back(line.y[i]);
    }
  }
  Axis x_axis = make_axis(xs, options.log_x, false);
  Axis y_axis = make_axis(ys, options.log_y, !options.log_y);
  x_axis.px_low = frame.plot_left();
  x_axis.px_high = frame.plot_right();
  y_axis.px_low = frame.plot_bottom();
  y_axis.px_high = frame.plot_top();
  frame.x_axis_ticks(x_axis);
  frame.y_axis_ticks(y_axis);
  frame.legend();
  size_t drawn = 0;
  for (size_t l = 0; l < lines.size(); ++l) {
    std::ostringstream path;
    std::ostringstream markers;
    const auto& line = lines[l];
    for (size_t i = 0; i < std::min(line.x.size(), line.y.size()); ++i) {
      double x = line.x[i], y = line.y[i];
      if (!std::isfinite(x) || !std::isfinite(y) || (options.log_x && x <= 0) ||
          (options.log_y && y <= 0))
        continue;
      path << number(x_axis.map(x)) << ',' << number(y_axis.map(y)) << ' ';
      markers << "<circle cx=\"" << number(x_axis.map(x)) << "\" cy=\"" << number(y_axis.map(y))
              << "\" r=\"3\" fill=\"" << color(l) << "\"><title>" << escape(line.name) << ": "
              << format_tick(x) << ", " << format_tick(y) << "</title></circle>\n";
      ++drawn;
    }
    frame.svg << "<polyline class=\"line\" points=\"" << path.str() << "\" fill=\"none\" stroke=\""
              << color(l) << "\" stroke-width=\"2\""
              << (line.dashed ? " stroke-dasharray=\"6 4\"" : "") << "/>\n"
              << markers.str();
  }
  if (drawn == 0) frame.note("no data");
  frame.axis_lines_and_labels();
  return frame.finish();
}

namespace {

std::string bars(const ChartOptions& options, const std::vector<std::string>& categories,
                 const std::vector<Series>& series, bool stacked) {
  std::vector<std::string> names;
  for (const auto& s : series) names.push_back(s.name);
  Frame frame(options, names);
  if (categories.size() > 6) frame.bottom = 96;
  std::vector<double> values{0};
  size_t missing = 0, clipped = 0;
  for (size_t c = 0; c < categories.size(); ++c) {
    double total = 0;
    for (const auto& s : series) {
      double v = c < s.values.size() ? s.values[c] : std::numeric_limits<double>::quiet_NaN();
      if (!std::isfinite(v)) { ++missing; continue; }
      if (stacked) {
        if (v < 0) { ++clipped; continue; }
        total += v;
      } else {
        values.push_back(v);
      }
    }
    if (stacked) values.push_back(total);
  }
  Axis y_axis = make_axis(values, false, true);
  y_axis.px_low = frame.plot_bottom();
  y_axis.px_high = frame.plot_top();
  Axis slots;  // category i occupies [i, i + 1)
  slots.low = 0;
  slots.high = std::max<double>(1, static_cast<double>(categories.size()));
  slots.px_low = frame.plot_left();
  slots.px_high = frame.plot_right();
  frame.y_axis_ticks(y_axis);
  frame.legend();
  double slot_px = slots.map(1) - slots.map(0);
  double zero_px = y_axis.map(0);
  size_t drawn = 0;
  for (size_t c = 0; c < categories.size(); ++c) {
    double base = 0;
    for (size_t k = 0; k < series.size(); ++k) {
      double v = c < series[k].values.size() ? series[k].values[c]
                                              : std::numeric_limits<double>::quiet_NaN();
      if (!std::isfinite(v) || (stacked && v < 0)) continue;
      double x, width, y_top, y_bottom;
      if (stacked) {
        width = slot_px * 0.6;
        x = slots.map(static_cast<double>(c)) + slot_px * 0.2;
        y_top = y_axis.map(base + v);
        y_bottom = y_axis.map(base);
        base += v;
      } else {
        width = slot_px * 0.8 / static_cast<double>(std::max<size_t>(1, series.size()));
        x = slots.map(static_cast<double>(c)) + slot_px * 0.1 + width * static_cast<double>(k);
        y_top = std::min(y_axis.map(v), zero_px);
        y_bottom = std::max(y_axis.map(v), zero_px);
      }
      frame.svg << "<rect class=\"bar\" x=\"" << number(x) << "\" y=\"" << number(y_top)
                << "\" width=\"" << number(width) << "\" height=\""
                << number(std::max(0.0, y_bottom - y_top)) << "\" fill=\"" << color(k)
                << "\"><title>" << escape(categories[c]) << " — " << escape(series[k].name)
                << ": " << format_tick(v) << "</title></rect>\n";
      ++drawn;
    }
  }
  frame.x_category_labels(categories, slots);
  if (drawn == 0) frame.note("no data");
  else if (clipped > 0) frame.note(std::to_string(clipped) + " negative value(s) not stacked");
  else if (missing > 0) frame.note(std::to_string(missing) + " value(s) missing");
  frame.svg << "<line x1=\"" << number(frame.plot_left()) << "\" y1=\"" << number(zero_px)
            << "\" x2=\"" << number(frame.plot_right()) << "\" y2=\"" << number(zero_px)
            << "\" stroke=\"#333\"/>\n";
  frame.axis_lines_and_labels();
  return frame.finish();
}

}  // namespace

std::string stacked_bars(const ChartOptions& options, const std::vector<std::string>& categories,
                         const std::vector<Series>& series) {
  return bars(options, categories, series, true);
}

std::string grouped_bars(const ChartOptions& options, const std::vector<std::string>& categories,
                         const std::vector<Series>& series) {
  return bars(options, categories, series, false);
}

}  // namespace stepcast::html
