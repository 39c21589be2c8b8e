// The CSV beside every report table: the Markdown table's cells exactly, a header row, RFC 4180
// quoting, named after the heading above, read back by parse_csv; and the byte counts in their cells.
#include <catch2/catch.hpp>

#include "csv_tables.hpp"
#include "errors.hpp"
#include "summary.hpp"

using namespace stepcast;

TEST_CASE("every Markdown table becomes a CSV that reads back cell for cell", "[reports][csv]") {
  const std::string markdown =
      "# stepcast plan: tiny\n\nsome text | not a table\n\n## Best plans\n\n"
      "| # | plan | step s | note |\n| --- | ---: | ---: | ---: |\n"
      "| 1 | tp2-pp1 | 0.125 | a, b |\n| 2 | x \\| y | 1e-3 | \"quoted\" |\n\n"
      "## Pruned\n\n| reason | plans |\n| --- | ---: |\n| does not fit in memory | 12 |\n"
      "\n## Pruned\n\n| reason | plans |\n| --- | --- |\n| `code` | 3 |\n";
  std::vector<CsvTable> tables = markdown_tables(markdown);
  REQUIRE(tables.size() == 3);
  CHECK(tables[0].name == "best-plans");
  CHECK(tables[1].name == "pruned");
  CHECK(tables[2].name == "pruned-2");
  CHECK(tables[0].header == std::vector<std::string>{"#", "plan", "step s", "note"});
  REQUIRE(tables[0].rows.size() == 2);
  CHECK(tables[0].rows[1] == std::vector<std::string>{"2", "x | y", "1e-3", "\"quoted\""});
  CHECK(tables[2].rows[0][0] == "code");
  std::string csv = to_csv(tables[0]);
  CHECK(csv == "#,plan,step s,note\r\n1,tp2-pp1,0.125,\"a, b\"\r\n2,x | y,1e-3,\"\"\"quoted\"\"\"\r\n");
  std::vector<std::vector<std::string>> back = parse_csv(csv, "best-plans.csv");
  REQUIRE(back.size() == 3);
  CHECK(back[0] == tables[0].header);
  CHECK(back[1] == tables[0].rows[0]);
  CHECK(back[2] == tables[0].rows[1]);
  CHECK_THROWS_AS(parse_csv("a,\"b\n", "bad.csv"), InputError);
}

TEST_CASE("byte counts print in binary units, a negative one (a plan's missing headroom) with its sign", "[reports]") {
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1.5 * 1024 * 1024 * 1024) == "1.50 GiB");
  CHECK(format_bytes(-5399776984.0) == "-5.03 GiB");
}
