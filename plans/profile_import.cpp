// Reading nccl-tests logs and GEMM CSVs, and merging them into a profile; see profile_import.hpp.
#include "profile_import.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "collective.hpp"
#include "errors.hpp"

namespace stepcast {

namespace {

[[noreturn]] void fail_at(const std::string& file, int line, const std::string& why, const std::string& valid) {
  throw InputError(file + (line > 0 ? ":" + std::to_string(line) : std::string()) + ": " + why +
                   "; valid: " + valid);
}

std::vector<std::string> split_ws(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

bool parse_number(const std::string& s, double& out) {
  try {
    size_t used = 0;
    out = std::stod(s, &used);
    return used == s.size() && std::isfinite(out);
  } catch (const std::exception&) {
    return false;
  }
}

// "12: # Rank ..." (srun --label) → "# Rank ...".
std::string without_srun_prefix(const std::string& line) {
  size_t at = line.find_first_not_of(" \t");
  if (at == std::string::npos) return line;
  size_t digits_end = line.find_first_not_of("0123456789", at);
  if (digits_end == at || digits_end == std::string::npos || line[digits_end] != ':') return line;
  if (digits_end + 1 >= line.size() || !std::isspace(static_cast<unsigned char>(line[digits_end + 1]))) return line;
  return line.substr(digits_end + 2);
}

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The collective of an nccl-tests binary named on the line ("./build/all_reduce_perf -b 8 ..."
// → "all_reduce"), or "".
std::string perf_binary_in(const std::string& line) {
  static const std::set<std::string> binaries = {"all_reduce", "all_gather", "reduce_scatter", "alltoall",
                                                 "sendrecv",   "broadcast",  "reduce",         "gather",
                                                 "scatter",    "hypercube"};
  for (size_t at = line.find("_perf"); at != std::string::npos; at = line.find("_perf", at + 1)) {
    size_t begin = at;
    while (begin > 0 && is_word_char(line[begin - 1])) --begin;
    std::string word = line.substr(begin, at - begin);
    if (binaries.count(word)) return word;
  }
  return "";
}

std::string digits_at(const std::string& line, size_t at) {
  size_t end = std::min(line.find_first_not_of("0123456789", at), line.size());
  return at < line.size() ? line.substr(at, end - at) : std::string();
}

// "2.28.3" at `at`, or "" when the text there is not three dotted numbers.
std::string dotted_version_at(const std::string& line, size_t at) {
  std::string out;
  for (int part = 0; part < 3; ++part) {
    std::string digits = digits_at(line, at);
    if (digits.empty()) return "";
    out += digits;
    at += digits.size();
    if (part < 2) {
      if (at >= line.size() || line[at] != '.') return "";
      out += '.';
      ++at;
    }
  }
  return out;
}

// Digits only, within [low, high].
bool parse_bounded(const std::string& digits, int64_t low, int64_t high, int64_t& out) {
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  out = std::stoll(digits);
  return out >= low && out <= high;
}

// "#  Rank  0 Group  0 Pid  1234 on node-1 device  0 [0x07] NVIDIA A100-SXM4-80GB": the rank
// (its digits, unchecked) and the host (the word after the last "on" that precedes "device").
struct RankLine {
  std::string rank, host;
};
std::optional<RankLine> rank_line_of(const std::string& line) {
  size_t hash = line.find('#');
  if (hash == std::string::npos) return std::nullopt;
  std::vector<std::string> words = split_ws(line.substr(hash + 1));
  if (words.size() < 5 || words[0] != "Rank" || words[1].find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  std::optional<RankLine> out;
  for (size_t i = 2; i + 2 < words.size(); ++i) {
    if (words[i] == "on" && words[i + 2].rfind("device", 0) == 0) out = RankLine{words[1], words[i + 1]};
  }
  return out;
}

// "all_reduce" → "all_reduce"; "alltoall" → "all_to_all".
std::string collective_of_binary(const std::string& name) {
  if (name == "alltoall") return "all_to_all";
  return name;
}

int64_t type_bytes(const std::string& type, const std::string& file, int line) {
  static const std::map<std::string, int64_t> sizes = {
      {"int8", 1},   {"uint8", 1},   {"int32", 4},  {"uint32", 4},  {"int64", 8},     {"uint64", 8},
      {"half", 2},   {"float", 4},   {"double", 8}, {"bfloat16", 2}, {"fp8_e4m3", 1}, {"fp8_e5m2", 1},
      {"float16", 2}, {"float32", 4}, {"float64", 8}};
  auto it = sizes.find(type);
  if (it == sizes.end()) fail_at(file, line, "unknown data type '" + type + "'", "nccl-tests' types (float, half, bfloat16, ...)");
  return it->second;
}

}  // namespace

namespace {

// One nccl-tests run's log, its lines numbered from first_line + 1 in the file; errors about the
// whole run name its first line where the file holds several (`several`).
NcclTestsLog parse_nccl_tests_section(const std::string& text, const std::string& file, const std::string& expected,
                                      int first_line, bool several) {
  const int run_line = several ? first_line + 1 : 0;
  NcclTestsLog log;
  log.file = file;
  std::istringstream in(text);
  std::string detected;
  std::set<int64_t> ranks;
  std::set<std::string> hosts;
  std::vector<std::string> columns;
  int header_line = 0;
  bool footer = false;
  int line_no = first_line;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    line = without_srun_prefix(line);
    if (detected.empty()) detected = collective_of_binary(perf_binary_in(line));
    if (size_t at = line.find("nccl-library="); at != std::string::npos) {
      std::string digits = digits_at(line, at + 13);
      int64_t code = 0;
      // NCCL_VERSION_CODE: major·10000 + minor·100 + patch (2.28.3 is 22803).
      if (!parse_bounded(digits, 1, 9999999, code)) {
        fail_at(file, line_no, "nccl-library='" + printable_excerpt(digits) + "'",
                "NCCL's version code, e.g. 22803 for 2.28.3");
      }
      log.nccl_version = std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
                         std::to_string(code % 100);
    } else if (size_t named = line.find("NCCL version "); log.nccl_version.empty() && named != std::string::npos) {
      std::string version = dotted_version_at(line, named + 13);
      if (!version.empty()) log.nccl_version = version;
    }
    if (size_t at = line.find(" coll channels"); at != std::string::npos && line.find("NCCL INFO") != std::string::npos) {
      size_t begin = line.rfind(' ', at - 1);
      std::string digits = begin == std::string::npos ? "" : line.substr(begin + 1, at - begin - 1);
      int64_t channels = 0;
      if (!parse_bounded(digits, 1, 1024, channels)) {
        fail_at(file, line_no, "'" + printable_excerpt(digits) + " coll channels'",
                "NCCL's count of collective channels, 1 to 1024");
      }
      log.coll_channels = std::max(log.coll_channels, channels);
      continue;
    }
    if (std::optional<RankLine> rank = rank_line_of(line)) {
      int64_t r = 0;
      if (!parse_bounded(rank->rank, 0, 9999999, r)) {
        fail_at(file, line_no, "rank '" + printable_excerpt(rank->rank) + "'", "a rank number below 10,000,000");
      }
      if (!ranks.insert(r).second) {
        fail_at(file, line_no, "rank " + std::to_string(r) + " is listed twice (a launch where every "
                "process ran alone, e.g. a non-MPI build under mpirun)", "one line per rank");
      }
      hosts.insert(rank->host);
      continue;
    }
    if (line.find("Avg bus bandwidth") != std::string::npos) {
      footer = true;
      continue;
    }
    std::vector<std::string> words = split_ws(line);
    if (words.empty()) continue;
    // The column header: "#  size  count  type  redop  root  time  algbw  busbw  #wrong ..."
    if (columns.empty() && std::find(words.begin(), words.end(), "size") != words.end() &&
        std::find(words.begin(), words.end(), "count") != words.end() &&
        std::find(words.begin(), words.end(), "busbw") != words.end()) {
      if (words.front() == "#") words.erase(words.begin());
      for (const char* needed : {"time", "type"}) {
        if (std::find(words.begin(), words.end(), needed) == words.end()) {
          fail_at(file, line_no, std::string("a table header without the '") + needed + "' column",
                  "nccl-tests' header '# size count type redop root time algbw busbw ...'");
        }
      }
      columns = words;
      header_line = line_no;
      continue;
    }
    double size = 0;
    if (columns.empty() || !parse_number(words.front(), size)) continue;
    // A data row: the out-of-place columns of the header.
    auto index_of = [&](const char* name) {
      return size_t(std::find(columns.begin(), columns.end(), name) - columns.begin());
    };
    size_t time_at = index_of("time"), count_at = index_of("count"), type_at = index_of("type");
    // The row reads size, count, type and the out-of-place time, algbw and busbw.
    if (words.size() < std::max({count_at, type_at, time_at + 2}) + 1) {
      fail_at(file, line_no, "a row cut short (" + std::to_string(words.size()) + " columns, the header at line " +
                  std::to_string(header_line) + " has " + std::to_string(columns.size()) + ")",
              "a complete nccl-tests log");
    }
    double count = 0, time_us = 0;
    if (!parse_number(words[count_at], count) || !parse_number(words[time_at], time_us) || !(time_us > 0) ||
        !(size > 0)) {
      fail_at(file, line_no, "a row whose size, count or time is not a positive number", "nccl-tests' rows");
    }
    CollectivePoint p;
    p.kind = "";
    p.algorithm = "nccl";
    p.bytes = size;
    p.time_s = time_us * 1e-6;
    p.algbw_bytes_per_s = p.bytes / p.time_s;
    log.points.push_back(p);
    // The row's shape tells the collective: count = size / type (all_reduce, sendrecv) or
    // size / type / ranks (all_gather, reduce_scatter, alltoall).
    double per_element = size / count / double(type_bytes(words[type_at], file, line_no));
    if (!ranks.empty() && (detected == "all_reduce" || detected == "sendrecv" || detected == "all_gather" ||
                           detected == "reduce_scatter" || detected == "all_to_all")) {
      bool gathered = detected == "all_gather" || detected == "reduce_scatter" || detected == "all_to_all";
      double want = gathered ? double(ranks.size()) : 1.0;
      if (std::abs(per_element - want) > 0.01 * want && size >= 4096) {
        std::ostringstream why;
        why << "rows count size / type / " << per_element << " elements, which is not " << detected
            << "_perf's table (it counts size / type" << (gathered ? " / ranks" : "") << ")";
        fail_at(file, line_no, why.str(), "the log of the collective it names");
      }
    }
  }
  if (detected.empty() && expected.empty()) {
    fail_at(file, run_line, "names no collective (no 'X_perf' in the log)",
            "KIND:FILE with KIND one of all_reduce, all_gather, reduce_scatter, all_to_all, sendrecv");
  }
  if (!expected.empty() && !detected.empty() && expected != detected) {
    fail_at(file, run_line, "is a " + detected + "_perf log, given as " + expected, "the collective the log measured");
  }
  log.collective = expected.empty() ? detected : expected;
  static const std::set<std::string> supported = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv"};
  if (!supported.count(log.collective)) {
    fail_at(file, run_line, "measures " + log.collective + ", which a profile does not use",
            "all_reduce, all_gather, reduce_scatter, all_to_all, sendrecv");
  }
  if (columns.empty()) {
    fail_at(file, run_line, "has no nccl-tests table (no '# size count type ...' header)", "an nccl-tests log");
  }
  if (log.points.empty()) {
    fail_at(file, run_line, "has a table header but no rows (truncated?)", "a complete nccl-tests log");
  }
  if (!footer) {
    fail_at(file, line_no, "ends without nccl-tests' 'Avg bus bandwidth' line (truncated?)", "a complete nccl-tests log");
  }
  if (ranks.empty()) {
    fail_at(file, run_line, "lists no ranks ('#  Rank  0 ... on HOST device ...' lines)",
            "an nccl-tests log with its device lines");
  }
  if (*ranks.rbegin() != int64_t(ranks.size()) - 1) {
    fail_at(file, run_line, "lists ranks that are not 0.." + std::to_string(ranks.size() - 1),
            "every rank's device line");
  }
  log.ranks = int64_t(ranks.size());
  log.nodes = int64_t(hosts.size());
  if (log.ranks % log.nodes != 0) {
    fail_at(file, run_line, std::to_string(log.ranks) + " ranks on " + std::to_string(log.nodes) +
                         " hosts, unevenly", "as many ranks on every host");
  }
  std::sort(log.points.begin(), log.points.end(),
            [](const CollectivePoint& a, const CollectivePoint& b) { return a.bytes < b.bytes; });
  for (size_t i = 1; i < log.points.size(); ++i) {
    if (log.points[i].bytes == log.points[i - 1].bytes) {
      fail_at(file, run_line, "measures size " + std::to_string(int64_t(log.points[i].bytes)) + " twice",
              "each size once");
    }
  }
  const std::optional<OpKind> kind = collective_kind(log.collective);  // none for sendrecv
  for (CollectivePoint& p : log.points) {
    p.kind = log.collective;
    p.group_size = log.ranks;
    p.nodes = log.nodes;
    p.busbw_bytes_per_s = kind ? p.algbw_bytes_per_s * bus_bandwidth_factor(*kind, log.ranks) : p.algbw_bytes_per_s;
  }
  return log;
}

// Whether a line opens an nccl-tests run: its version line, "# Collective test starting", the
// "# nThread" parameters, or the X_perf command echoed (not "# Collective test concluded: X_perf").
bool opens_run(const std::string& line) {
  if (line.find("# Collective test concluded") != std::string::npos) return false;
  return line.find("# nccl-tests version") != std::string::npos ||
         line.find("# Collective test starting") != std::string::npos ||
         line.find("# nThread") != std::string::npos || !perf_binary_in(line).empty();
}

}  // namespace

NcclTestsLog parse_nccl_tests_log(const std::string& text, const std::string& file,
                                  const std::string& expected) {
  return parse_nccl_tests_section(text, file, expected, 0, false);
}

std::vector<NcclTestsLog> parse_nccl_tests_logs(const std::string& text, const std::string& file,
                                                const std::string& expected) {
  // A run ends at its "Avg bus bandwidth" line; the next line that opens a run starts another.
  std::vector<std::pair<int, std::string>> runs{{0, ""}};
  std::istringstream in(text);
  bool ended = false;
  int line_no = 0;
  for (std::string line; std::getline(in, line); ++line_no) {
    if (ended && opens_run(without_srun_prefix(line))) {
      runs.push_back({line_no, ""});
      ended = false;
    }
    if (line.find("Avg bus bandwidth") != std::string::npos) ended = true;
    runs.back().second += line + "\n";
  }
  std::vector<NcclTestsLog> logs;
  for (size_t i = 0; i < runs.size(); ++i) {
    logs.push_back(parse_nccl_tests_section(runs[i].second, file, expected, runs[i].first, runs.size() > 1));
    logs.back().run = runs.size() > 1 ? int(i) + 1 : 0;
  }
  for (size_t i = 0; i < logs.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      const NcclTestsLog &a = logs[j], &b = logs[i];
      if (a.collective == b.collective && a.ranks == b.ranks && a.nodes == b.nodes) {
        fail_at(file, runs[i].first + 1,
                "a second " + b.collective + "_perf run on " + std::to_string(b.ranks) +
                    " ranks (the first begins at line " + std::to_string(runs[j].first + 1) + ")",
                "one run of each collective and span in a log");
      }
    }
  }
  return logs;
}

GemmCsv parse_gemm_csv(const std::string& text, const std::string& file) {
  GemmCsv csv;
  csv.file = file;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  std::vector<std::string> header;
  auto cells_of = [](const std::string& l) {
    std::vector<std::string> out;
    std::stringstream s(l);
    for (std::string c; std::getline(s, c, ',');) {
      c.erase(0, c.find_first_not_of(" \t\r"));
      c.erase(c.find_last_not_of(" \t\r") + 1);
      out.push_back(c);
    }
    return out;
  };
  while (header.empty() && std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[0] == '#') continue;
    header = cells_of(line);
  }
  if (header.empty()) fail_at(file, 0, "is empty", "a CSV with a header line");
  auto column = [&](const std::string& name, bool required) -> int {
    auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end()) {
      if (required) fail_at(file, 1, "has no '" + name + "' column", "a header with m, n, k, layout, dtype and seconds or tflops");
      return -1;
    }
    return int(it - header.begin());
  };
  int cm = column("m", true), cn = column("n", true), ck = column("k", true), cl = column("layout", true),
      cd = column("dtype", true), cs = column("seconds", false), ct = column("tflops", false),
      cc = column("count", false), csrc = column("source", false);
  if (cs < 0 && ct < 0) fail_at(file, 1, "has neither a 'seconds' nor a 'tflops' column", "one of them (the time's unit)");
  std::string dtype_name;
  std::set<std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>> seen;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[0] == '#') continue;
    std::vector<std::string> cells = cells_of(line);
    if (cells.size() < header.size()) {
      fail_at(file, line_no, "has " + std::to_string(cells.size()) + " cells, the header " + std::to_string(header.size()),
              "one cell per column");
    }
    auto integer = [&](int at, const char* name) {
      double v = 0;
      if (!parse_number(cells[size_t(at)], v) || v < 1 || v != std::floor(v) || v > 9e15) {
        fail_at(file, line_no, std::string("column '") + name + "' = '" + cells[size_t(at)] + "'", "a positive integer");
      }
      return int64_t(v);
    };
    GemmPoint g;
    g.m = integer(cm, "m");
    g.n = integer(cn, "n");
    g.k = integer(ck, "k");
    g.count = cc >= 0 ? integer(cc, "count") : 1;
    std::string layout = cells[size_t(cl)];
    std::transform(layout.begin(), layout.end(), layout.begin(), ::tolower);
    static const std::map<std::string, std::string> layouts = {
        {"forward", "forward"}, {"dgrad", "dgrad"}, {"wgrad", "wgrad"}, {"tn", "forward"}, {"nn", "dgrad"}, {"nt", "wgrad"}};
    auto l = layouts.find(layout);
    if (l == layouts.end()) {
      fail_at(file, line_no, "layout '" + cells[size_t(cl)] + "'", "forward, dgrad, wgrad, or TN, NN, NT (cuBLAS, column-major)");
    }
    g.variant = l->second;
    std::string d = cells[size_t(cd)];
    if (!parse_dtype(d)) fail_at(file, line_no, "dtype '" + d + "'", "fp64, fp32, tf32, bf16, fp16, fp8");
    if (dtype_name.empty()) dtype_name = d;
    if (d != dtype_name) fail_at(file, line_no, "dtype '" + d + "' after '" + dtype_name + "'", "one dtype per CSV");
    double value = 0;
    int at = cs >= 0 ? cs : ct;
    if (!parse_number(cells[size_t(at)], value) || !(value > 0)) {
      fail_at(file, line_no, std::string("column '") + header[size_t(at)] + "' = '" + cells[size_t(at)] + "'",
              "a positive number");
    }
    g.time_s = cs >= 0 ? value : g.flops() / (value * 1e12);
    if (csrc >= 0) g.source = cells[size_t(csrc)];
    if (!seen.insert({g.variant, g.count, g.m, g.n, g.k}).second) {
      fail_at(file, line_no, "repeats " + g.variant + " " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" +
                                 std::to_string(g.k), "each shape once");
    }
    csv.points.push_back(g);
  }
  if (csv.points.empty()) fail_at(file, 0, "has a header but no rows", "one row per GEMM shape");
  csv.dtype = *parse_dtype(dtype_name);
  static const std::map<std::string, int> variant_order = {{"forward", 0}, {"dgrad", 1}, {"wgrad", 2}};
  std::sort(csv.points.begin(), csv.points.end(), [](const GemmPoint& a, const GemmPoint& b) {
    return std::make_tuple(variant_order.at(a.variant), a.count, a.m, a.n, a.k) <
           std::make_tuple(variant_order.at(b.variant), b.count, b.m, b.n, b.k);
  });
  // A full grid per variant (single GEMMs only) can be interpolated.
  std::map<std::string, std::set<std::tuple<int64_t, int64_t, int64_t>>> shapes;
  std::map<std::string, std::array<std::set<int64_t>, 3>> axes;
  bool batched = false;
  for (const GemmPoint& g : csv.points) {
    batched = batched || g.count != 1;
    shapes[g.variant].insert({g.m, g.n, g.k});
    axes[g.variant][0].insert(g.m);
    axes[g.variant][1].insert(g.n);
    axes[g.variant][2].insert(g.k);
  }
  csv.grid = !batched;
  for (const auto& [variant, a] : axes) {
    csv.grid = csv.grid && shapes[variant].size() == a[0].size() * a[1].size() * a[2].size() &&
               a[0].size() >= 2 && a[1].size() >= 2 && a[2].size() >= 2;
  }
  return csv;
}

DeviceProfile merge_imports(DeviceProfile base, const std::vector<NcclTestsLog>& logs, const GemmCsv* gemm,
                            std::vector<std::string>* unused) {
  if (!base.measured) {
    base.measured = MeasuredTables{};
    base.measured->dtype = gemm ? gemm->dtype : Dtype::bf16;
    base.measured->method = Json::object();
  }
  MeasuredTables& t = *base.measured;
  auto sixteen = [](Dtype d) { return d == Dtype::bf16 || d == Dtype::fp16; };
  if (gemm && gemm->dtype != t.dtype && !(sixteen(gemm->dtype) && sixteen(t.dtype))) {
    throw InputError(base.file + ": key 'measured.dtype' = \"" + std::string(to_string(t.dtype)) +
                     "\": the GEMM CSV is " + to_string(gemm->dtype) +
                     "; valid: a base profile of the CSV's dtype, or none");
  }
  auto source_key = [&](const std::string& file, const std::string& what, const std::string& suffix = "") {
    std::string key = "import:" + std::filesystem::path(file).filename().string() + suffix;
    base.sources[key] = what + " " + file;
    return key;
  };
  std::array<bool, 2> overlap_set{};  // a log set the CTAs inside a node, across nodes
  for (size_t i = 0; i < logs.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      const NcclTestsLog &a = logs[j], &b = logs[i];
      if (a.collective == b.collective && a.ranks == b.ranks && a.nodes == b.nodes) {
        throw InputError(b.file + ": measures " + b.collective + " on " + std::to_string(b.ranks) + " ranks and " +
                         std::to_string(b.nodes) + (b.nodes == 1 ? " node" : " nodes") + ", as " + a.file +
                         " does; valid: one log of each collective and span");
      }
    }
  }
  for (const NcclTestsLog& log : logs) {
    std::string key = source_key(log.file,
                                 "nccl-tests " + log.collective + "_perf log" +
                                     (log.nccl_version.empty() ? "" : " (NCCL " + log.nccl_version + ")") +
                                     (log.run > 0 ? ", run " + std::to_string(log.run) + " of" : ","),
                                 log.run > 0 ? "#" + std::to_string(log.run) : "");
    if (log.collective == "sendrecv") {  // inside a node p2p_points, across nodes p2p_inter_node_points
      std::vector<P2pPoint>& table = log.nodes > 1 ? t.p2p_inter_node : t.p2p;
      table.clear();
      for (const CollectivePoint& p : log.points) table.push_back({p.bytes, p.time_s, key});
      continue;
    }
    t.collectives.erase(std::remove_if(t.collectives.begin(), t.collectives.end(),
                                       [&](const CollectivePoint& c) {
                                         return c.kind == log.collective && c.group_size == log.ranks &&
                                                c.nodes == log.nodes && c.algorithm == "nccl";
                                       }),
                        t.collectives.end());
    for (CollectivePoint p : log.points) {
      p.source = key;
      t.collectives.push_back(p);
    }
    if (log.coll_channels > 0) {
      if (!base.overlap.modelled() || log.coll_channels >= base.overlap.sms) {
        if (unused) {
          unused->push_back(log.file + ": its " + std::to_string(log.coll_channels) + " coll channels are not the " +
                            "profile's overlap CTAs: " + (base.overlap.modelled()
                                ? "not fewer than the base's overlap.sms (" + std::to_string(base.overlap.sms) + ")"
                                : "the base profile gives no overlap.sms (the device's SMs)"));
        }
        continue;
      }
      int64_t& ctas = log.nodes > 1 ? base.overlap.ctas_inter_node : base.overlap.ctas_intra_node;
      if (!overlap_set[log.nodes > 1]) ctas = 0;  // the first log of a span replaces the base's
      overlap_set[log.nodes > 1] = true;
      ctas = std::max(ctas, log.coll_channels);
      base.overlap_notes += std::string(base.overlap_notes.empty() ? "" : " ") + "collective_ctas_" +
                            (log.nodes > 1 ? "inter" : "intra") + "_node from " + key + ": " +
                            std::to_string(log.coll_channels) + " coll channels (NCCL_DEBUG=INFO).";
    }
  }
  if (gemm) {
    std::string key = source_key(gemm->file, "GEMM sweep CSV");
    t.gemm = gemm->points;
    for (GemmPoint& g : t.gemm) {
      // A row's own source column is its citation; otherwise the CSV is.
      if (!g.source.empty()) base.sources.emplace(g.source, "named in the source column of " + gemm->file);
      if (g.source.empty()) g.source = key;
    }
    t.gemm_use = gemm->grid ? "table" : "fit";
  }
  return base;
}

}  // namespace stepcast
