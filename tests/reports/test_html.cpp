// The report building blocks: escaping, ticks, and that each chart draws one mark per value,
// keeps the y = x band where it belongs, and says so when values are missing.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <regex>
#include <string>

#include "html.hpp"

using namespace stepcast;

namespace {

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("html escapes markup in cells, labels and titles", "[html]") {
  CHECK(html::escape("a<b & \"c\" 'd'>") == "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
  std::string t = html::table({"plan", "error"}, {{"<tp2>", "3.5%"}, {"x", "-1.2"}});
  CHECK(t.find("&lt;tp2&gt;") != std::string::npos);
  CHECK(t.find("<tp2>") == std::string::npos);
  CHECK(count(t, "<td class=\"num\">") == 2);
  CHECK(count(t, "<tr>") == 3);
  std::string p = html::page("A & B", "<p>x</p>");
  CHECK(p.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(p.find("<title>A &amp; B</title>") != std::string::npos);
}

TEST_CASE("nice ticks cover the range in 1-2-5 steps", "[html]") {
  auto ticks = html::nice_ticks(0.013, 0.087);
  REQUIRE(ticks.size() >= 2);
  CHECK(ticks.front() <= 0.013);
  CHECK(ticks.back() >= 0.087);
  double step = ticks[1] - ticks[0];
  for (size_t i = 1; i < ticks.size(); ++i) CHECK(ticks[i] - ticks[i - 1] == Approx(step));
  double mantissa = step / std::pow(10, std::floor(std::log10(step)));
  CHECK((mantissa == Approx(1) || mantissa == Approx(2) || mantissa == Approx(2.5) ||
         mantissa == Approx(5)));
  CHECK(html::nice_ticks(-3, 7).front() <= -3);
  CHECK(html::format_tick(1.5e9) == "1.5e+09");
  CHECK(html::format_tick(0.25) == "0.25");
}

TEST_CASE("scatter chart draws a point per finite value and the band around y = x", "[html]") {
  html::ChartOptions o;
  o.title = "predicted vs measured";
  std::vector<html::Point> points = {{1.0, 1.02, "a"}, {2.0, 1.9, "b"},
                                     {3.0, std::numeric_limits<double>::quiet_NaN(), "c"}};
  std::string svg = html::scatter_chart(o, points, 0.05);
  CHECK(count(svg, "<circle class=\"point\"") == 2);
  CHECK(count(svg, "class=\"band\"") == 1);
  CHECK(count(svg, "class=\"diagonal\"") == 1);
  CHECK(svg.find("1 point(s) without a value left out") != std::string::npos);
  CHECK(count(svg, "<svg") == 1);
  CHECK(count(svg, "</svg>") == 1);
  // The diagonal runs corner to corner of a square range: its end points sit on the frame.
  std::smatch m;
  REQUIRE(std::regex_search(svg, m, std::regex(
      "class=\"diagonal\" x1=\"([0-9.]+)\" y1=\"([0-9.]+)\" x2=\"([0-9.]+)\" y2=\"([0-9.]+)\"")));
  CHECK(std::stod(m[1]) == Approx(78));
  CHECK(std::stod(m[2]) == Approx(o.height_px - 58));
  CHECK(std::stod(m[4]) == Approx(40));  // no legend: the plot starts under the title
  std::string empty = html::scatter_chart(o, {}, 0.05);
  CHECK(empty.find("no data") != std::string::npos);
}

TEST_CASE("bar charts draw one rectangle per value — stacks add up", "[html]") {
  html::ChartOptions o;
  o.title = "breakdown";
  std::vector<std::string> categories = {"p1", "p2", "p3"};
  std::vector<html::Series> series = {{"compute", {1, 2, 3}}, {"comm", {0.5, 0.5, 0.5}}};
  std::string stacked = html::stacked_bars(o, categories, series);
  CHECK(count(stacked, "<rect class=\"bar\"") == 6);
  CHECK(count(stacked, "class=\"legend\"") == 2);
  std::string grouped = html::grouped_bars(o, categories, {{"error", {-2, 3, 1}}});
  CHECK(count(grouped, "<rect class=\"bar\"") == 3);
  std::string clipped = html::stacked_bars(o, {"p"}, {{"x", {-1}}, {"y", {2}}});
  CHECK(clipped.find("1 negative value(s) not stacked") != std::string::npos);
}

TEST_CASE("line chart on a log-2 axis places powers of two evenly", "[html]") {
  html::ChartOptions o;
  o.title = "speedup";
  o.log_x = true;
  std::string svg = html::line_chart(o, {{"ideal", {1, 2, 4, 8}, {1, 2, 4, 8}, true},
                                         {"simulated", {1, 2, 4, 8}, {1, 1.9, 3.6, 6.5}, false}});
  CHECK(count(svg, "<polyline class=\"line\"") == 2);
  std::smatch m;
  std::string first = svg.substr(svg.find("<polyline"));
  REQUIRE(std::regex_search(first, m, std::regex("points=\"([0-9.]+),[0-9.]+ ([0-9.]+),[0-9.]+ ([0-9.]+),")));
  double x1 = std::stod(m[1]), x2 = std::stod(m[2]), x3 = std::stod(m[3]);
  CHECK(x2 - x1 == Approx(x3 - x2));
}

TEST_CASE("a crowded scatter names only the points outside the band", "[html]") {
  html::ChartOptions o;
  std::vector<html::Point> points;
  for (int i = 1; i <= 20; ++i) points.push_back({double(i), double(i) * (i == 7 ? 1.2 : 1.01), "p" + std::to_string(i)});
  std::string svg = html::scatter_chart(o, points, 0.05);
  CHECK(count(svg, "<circle class=\"point\"") == 20);
  CHECK(count(svg, ">p7</text>") == 1);
  CHECK(count(svg, ">p8</text>") == 0);
}
