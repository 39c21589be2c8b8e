// HTML for the reports: escaping, the page with its inline style sheet, headings, notes and
// tables. The SVG charts are in html_charts.cpp; both are declared in html.hpp.
#include "html.hpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace stepcast::html {

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string page(const std::string& title, const std::string& body_html) {
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>"
      << escape(title) << "</title>\n<style>\n"
      << "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222;"
         "max-width:1200px}\n"
      << "table{border-collapse:collapse;margin:12px 0;font-size:13px}\n"
      << "th,td{border:1px solid #ccc;padding:3px 8px}th{background:#f3f3f3;text-align:left}\n"
      << "td.num{text-align:right;font-variant-numeric:tabular-nums}\n"
      << "svg.chart{display:block;margin:12px 0;border:1px solid #ddd}\n"
      << "p.note{color:#555;font-size:13px}\n"
      << "</style>\n</head>\n<body>\n"
      << body_html << "\n</body>\n</html>\n";
  return out.str();
}

std::string heading(const std::string& text, int level) {
  level = std::clamp(level, 1, 6);
  return "<h" + std::to_string(level) + ">" + escape(text) + "</h" + std::to_string(level) + ">\n";
}

std::string paragraph(const std::string& text) { return "<p class=\"note\">" + escape(text) + "</p>\n"; }

std::string table(const std::vector<std::string>& headers,
                  const std::vector<std::vector<std::string>>& rows) {
  auto numeric = [](const std::string& cell) {
    if (cell.empty()) return false;
    char* end = nullptr;
    std::strtod(cell.c_str(), &end);
    return end != cell.c_str() && (*end == '\0' || *end == '%' || *end == ' ' || *end == 'x');
  };
  std::ostringstream out;
  out << "<table>\n<tr>";
  for (const auto& h : headers) out << "<th>" << escape(h) << "</th>";
  out << "</tr>\n";
  for (const auto& row : rows) {
    out << "<tr>";
    for (const auto& cell : row)
      out << (numeric(cell) ? "<td class=\"num\">" : "<td>") << escape(cell) << "</td>";
    out << "</tr>\n";
  }
  out << "</table>\n";
  return out.str();
}

}  // namespace stepcast::html
