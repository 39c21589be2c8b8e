// Markdown tables to CSV and back; see csv_tables.hpp.
#include "csv_tables.hpp"

#include <cctype>
#include <map>
#include <sstream>

#include "errors.hpp"

namespace stepcast {

namespace {

std::string trim(const std::string& s) {
  size_t begin = s.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r") + 1 - begin);
}

// "| a | b \| c |" → {"a", "b | c"}.
std::vector<std::string> split_row(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 1; i < line.size(); ++i) {  // after the leading '|'
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (line[i] == '|') {
      cells.push_back(trim(cell));
      cell.clear();
    } else {
      cell += line[i];
    }
  }
  for (std::string& c : cells) {
    if (c.size() >= 2 && c.front() == '`' && c.back() == '`') c = c.substr(1, c.size() - 2);
  }
  return cells;
}

bool separator_row(const std::vector<std::string>& cells) {
  for (const std::string& c : cells) {
    if (c.empty() || c.find_first_not_of("-: ") != std::string::npos) return false;
  }
  return !cells.empty();
}

std::string stem(const std::string& heading) {
  std::string out;
  for (char c : heading) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out += char(std::tolower(static_cast<unsigned char>(c)));
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "table" : out;
}

std::string csv_cell(const std::string& cell) {
  if (cell.find_first_of(",\"\n\r") == std::string::npos && cell == trim(cell)) return cell;
  std::string out = "\"";
  for (char c : cell) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

std::vector<CsvTable> markdown_tables(const std::string& markdown) {
  std::vector<CsvTable> tables;
  std::map<std::string, int> used;
  std::string heading = "table";
  bool in_table = false;
  std::istringstream in(markdown);
  for (std::string line; std::getline(in, line);) {
    line = trim(line);
    if (line.rfind("#", 0) == 0) {
      heading = stem(line.substr(line.find_first_not_of('#')));
      in_table = false;
      continue;
    }
    if (line.empty() || line[0] != '|') {
      in_table = false;
      continue;
    }
    std::vector<std::string> cells = split_row(line);
    if (!in_table) {
      CsvTable table;
      int n = ++used[heading];
      table.name = n == 1 ? heading : heading + "-" + std::to_string(n);
      table.header = cells;
      tables.push_back(table);
      in_table = true;
    } else if (!(tables.back().rows.empty() && separator_row(cells))) {
      tables.back().rows.push_back(cells);
    }
  }
  return tables;
}

std::string to_csv(const CsvTable& table) {
  std::ostringstream out;
  auto row = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) out << (i ? "," : "") << csv_cell(cells[i]);
    out << "\r\n";
  };
  row(table.header);
  for (const auto& r : table.rows) row(r);
  return out.str();
}

std::vector<std::vector<std::string>> parse_csv(const std::string& text, const std::string& file) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string cell;
  bool quoted = false, any = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        cell += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cell += c;
      }
    } else if (c == '"') {
      quoted = any = true;
    } else if (c == ',') {
      row.push_back(cell);
      cell.clear();
      any = true;
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      row.push_back(cell);
      rows.push_back(row);
      row.clear();
      cell.clear();
      any = false;
    } else {
      cell += c;
      any = true;
    }
  }
  if (quoted) throw InputError(file + ": a quoted CSV cell is not closed; valid: RFC 4180 CSV");
  if (any || !cell.empty()) {
    row.push_back(cell);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace stepcast
