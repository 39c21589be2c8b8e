// The tables of a Markdown report as CSV files (RFC 4180: a header row, cells quoted where they
// hold a comma, quote or line break): every report writes one beside it per table, so the CSV
// holds exactly what the table shows. A table is named after the heading above it.
#pragma once

#include <string>
#include <vector>

namespace stepcast {

struct CsvTable {
  std::string name;  // "best-plans": the heading above the table as a file stem, else "table"
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};

// The pipe tables of `markdown` in order (cells unescaped, `code` marks dropped); names made
// unique with "-2", "-3", ...
std::vector<CsvTable> markdown_tables(const std::string& markdown);
std::string to_csv(const CsvTable& table);
// Rows of CSV text (the header first); InputError naming `file` for an unterminated quote.
std::vector<std::vector<std::string>> parse_csv(const std::string& text, const std::string& file);

}  // namespace stepcast
