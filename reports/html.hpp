// HTML pages with inline SVG charts for stepcast's reports (validate, plan, compare-strategies,
// scale). Pure functions from data to text: no I/O, no scripts, no external resources, so a
// report is one self-contained file that opens anywhere. Cells and labels are escaped here;
// callers pass plain text. Non-finite values are left out of charts (and counted in a note).
#pragma once

#include <string>
#include <vector>

namespace stepcast::html {

std::string escape(const std::string& text);

// A complete HTML5 document with the project's inline style sheet; body_html is inserted as is
// (the page adds no heading of its own: start the body with heading(title, 1)).
std::string page(const std::string& title, const std::string& body_html);

// <h2>/<p> helpers so callers do not assemble tags by hand.
std::string heading(const std::string& text, int level = 2);
std::string paragraph(const std::string& text);

// A table; every cell is escaped. Cells that look numeric are right-aligned.
std::string table(const std::vector<std::string>& headers,
                  const std::vector<std::vector<std::string>>& rows);

struct ChartOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_x = false;  // base-10 (or base-2 when every x is a power of two) axis
  bool log_y = false;
  int width_px = 640;
  int height_px = 360;
};

struct Point {
  double x = 0;
  double y = 0;
  std::string label;  // shown next to the point and in its tooltip
};

// Points, plus the diagonal y = x and a ±band_fraction band around it when band_fraction > 0
// (predicted against measured). Axes share one range when band_fraction > 0.
std::string scatter_chart(const ChartOptions& options, const std::vector<Point>& points,
                          double band_fraction = 0);

struct Line {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;
  bool dashed = false;
};

std::string line_chart(const ChartOptions& options, const std::vector<Line>& lines);

// One value per category in each series. stacked_bars stacks the series on each category;
// grouped_bars puts them side by side. Negative values are drawn below zero in grouped bars and
// clipped to zero (with a note) in stacked bars.
struct Series {
  std::string name;
  std::vector<double> values;
};

std::string stacked_bars(const ChartOptions& options, const std::vector<std::string>& categories,
                         const std::vector<Series>& series);
std::string grouped_bars(const ChartOptions& options, const std::vector<std::string>& categories,
                         const std::vector<Series>& series);

// "Nice" axis ticks covering [low, high] (1, 2, 5 × 10^k steps), at most about max_ticks.
std::vector<double> nice_ticks(double low, double high, int max_ticks = 6);

// A number for a chart label: 3 significant digits, SI-free (1.23e+09 style beyond 1e6).
std::string format_tick(double value);

}  // namespace stepcast::html
