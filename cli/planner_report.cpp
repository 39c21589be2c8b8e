// The planner's reports; see planner_report.hpp. Markdown tables mirror the HTML tables; the
// HTML adds the charts.
#include "planner_report.hpp"

#include <cmath>
#include <map>
#include <sstream>

#include "csv_tables.hpp"
#include "html.hpp"
#include "inputs.hpp"
#include "planner_common.hpp"
#include "summary.hpp"
#include "units.hpp"

namespace stepcast::cli {

namespace {


std::string markdown_table(const std::vector<std::string>& headers,
                           const std::vector<std::vector<std::string>>& rows) {
  std::ostringstream out;
  out << "|";
  for (const auto& h : headers) out << " " << h << " |";
  out << "\n|";
  for (size_t i = 0; i < headers.size(); ++i) out << (i == 0 ? " --- |" : " ---: |");
  out << "\n";
  for (const auto& r : rows) {
    out << "|";
    for (const auto& cell : r) out << " " << cell << " |";
    out << "\n";
  }
  return out.str();
}

std::string gib_cell(double bytes) { return fixed(bytes / kGiB, 2); }

void write_both(const std::string& dir, const std::string& title, const std::string& markdown,
                const std::string& html_body) {
  write_output_file(dir, "report.md", "# " + title + "\n\n" + markdown);
  write_csv_tables(dir, markdown);
  write_output_file(dir, "report.html", html::page(title, html::heading(title, 1) + html_body));
}

// compare-strategies --moe-skew-sweep: step time against the routing skew, a line per layout.
void append_skew_section(const std::vector<SkewPoint>& points, std::ostringstream& md, std::ostringstream& body) {
  std::vector<std::string> headers = {"strategy", "plan", "skew", "step s", "vs first skew", "variation s",
                                      "load ratio", "dropped copies", "peak GiB", "fits", "note"};
  std::vector<std::vector<std::string>> rows;
  std::vector<html::Line> lines;
  std::map<std::string, double> first;  // each plan's step time at its first simulated skew
  for (const SkewPoint& p : points) {
    if (lines.empty() || lines.back().name != p.strategy) lines.push_back({p.strategy, {}, {}});
    const bool ok = p.simulated;
    if (ok) first.emplace(p.plan, p.step_time_s);
    auto cell = [&](double v, int digits) { return ok ? fixed(v, digits) : std::string("-"); };
    rows.push_back({p.strategy, p.plan, fixed(p.skew, 2), cell(p.step_time_s, 3),
                    ok ? fixed(100 * (p.step_time_s / first.at(p.plan) - 1), 1) + "%" : "-",
                    cell(p.variability_s, 3), cell(p.load_ratio_mean, 2), cell(p.dropped_tokens, 0),
                    ok ? gib_cell(p.peak_bytes) : "-", ok ? (p.fits ? "yes" : "no") : "-", p.note});
    if (!ok) continue;
    lines.back().x.push_back(p.skew);
    lines.back().y.push_back(p.step_time_s);
  }
  const std::string note =
      "Each layout's plan simulated again with moe_routing \"skew\": expert e receives a share ∝ 1/(e+1)^skew of "
      "the routed copies (0: uniform), drawn per microbatch and layer with the plan's seed. Load ratio: the "
      "busiest ep rank's expert load over the mean, averaged over the draws; dropped copies: those a capacity "
      "factor drops in the step (dropless: 0, its buffers grow instead, see peak).";
  md << "\n## Routing skew\n\n" << note << "\n\n" << markdown_table(headers, rows);
  html::ChartOptions o;
  o.title = "Simulated step time against the routing skew";
  o.x_label = "routing skew (Zipf exponent)";
  o.y_label = "seconds";
  body << html::heading("Routing skew") << html::paragraph(note) << html::table(headers, rows)
       << html::line_chart(o, lines);
}

}  // namespace

std::vector<std::string> write_csv_tables(const std::string& dir, const std::string& markdown) {
  std::vector<std::string> names;
  for (const CsvTable& table : markdown_tables(markdown)) {
    names.push_back(table.name + ".csv");
    write_output_file(dir, names.back(), to_csv(table));
  }
  return names;
}

void write_plan_report(const std::string& dir, const PlanReport& r) {
  std::vector<std::string> headers = {"#", "plan", "step s", "source", "estimate s", "tokens/s",
                                      "MFU", "peak GiB", "headroom GiB", "tp GiB", "dp GiB",
                                      "pp GiB", "other GiB"};
  const bool energy = !r.rows.empty() && r.rows.front().energy_j.has_value();
  const bool cost = !r.rows.empty() && r.rows.front().cost.has_value();
  if (energy) headers.push_back("J/step");
  if (cost) headers.push_back(r.currency + "/step");
  std::vector<std::vector<std::string>> rows;
  for (const auto& row : r.rows) {
    rows.push_back({std::to_string(row.rank), row.name, fixed(row.step_time_s, 3),
                    row.simulated ? "simulate " + r.sim_mode : "estimate", fixed(row.estimate_s, 3),
                    fixed(row.tokens_per_s, 0), fixed(row.mfu, 3), gib_cell(row.peak_bytes),
                    gib_cell(row.headroom_bytes), gib_cell(row.comm_tp_bytes), gib_cell(row.comm_dp_bytes),
                    gib_cell(row.comm_pp_bytes), gib_cell(row.comm_other_bytes)});
    if (energy) rows.back().push_back(row.energy_j ? fixed(*row.energy_j, 0) : "");
    if (cost) rows.back().push_back(row.cost ? fixed(*row.cost, 4) : "");
  }
  std::vector<std::vector<std::string>> pruned;
  for (const auto& [reason, n] : r.pruned_counts) pruned.push_back({reason, std::to_string(n)});
  std::ostringstream summary;
  summary << r.candidates << " candidates, " << r.all_names.size() << " fit, objective "
          << r.objective << ", searched in " << fixed(r.wall_s, 1)
          << " s. Communication columns are bytes one rank sends per step (largest over stages).";
  std::ostringstream md;
  md << summary.str() << "\n\n## Best plans\n\n" << markdown_table(headers, rows)
     << "\n## Pruned\n\n" << markdown_table({"reason", "plans"}, pruned);
  std::ostringstream body;
  body << html::paragraph(summary.str()) << html::heading("Best plans")
       << html::table(headers, rows);
  std::vector<html::Series> breakdown_series = {{"simulated or estimated step s", {}},
                                                {"quick estimate s", {}}};
  std::vector<std::string> categories;
  for (const auto& row : r.rows) {
    categories.push_back(std::to_string(row.rank));
    breakdown_series[0].values.push_back(row.step_time_s);
    breakdown_series[1].values.push_back(row.estimate_s);
  }
  html::ChartOptions bars;
  bars.title = "Step time of the best plans (by rank)";
  bars.x_label = "rank";
  bars.y_label = "step time (s)";
  body << html::grouped_bars(bars, categories, breakdown_series);
  std::vector<html::Point> points;
  for (size_t i = 0; i < r.all_names.size(); ++i) {
    points.push_back({r.all_peaks_bytes[i] / kGiB, r.all_estimates_s[i],
                      i < 5 ? r.all_names[i] : std::string()});
  }
  html::ChartOptions scatter;
  scatter.title = "Every plan that fits: peak memory against quick estimate";
  scatter.x_label = "peak per device (GiB; upper bound where not walked)";
  scatter.y_label = "estimated step time (s)";
  scatter.log_y = true;
  body << html::scatter_chart(scatter, points) << html::heading("Pruned")
       << html::table({"reason", "plans"}, pruned);
  write_both(dir, r.title, md.str(), body.str());
}

void write_strategy_report(const std::string& dir, const StrategyReport& r) {
  std::vector<std::string> headers = {"strategy", "plan", "fits", "weights GiB", "grads GiB",
                                      "optimizer GiB", "activations GiB", "workspace+comm GiB",
                                      "placement GiB", "runtime GiB", "peak GiB", "step s", "exposed comm s",
                                      "bubble s", "comm GiB/rank", "MFU", "J/step", "note"};
  const bool moe = !r.rows.empty() && r.rows.front().moe;
  if (moe) headers.insert(headers.end() - 1, {"a2a est. s", "imbalance est. s", "variation s"});
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> categories;
  std::vector<html::Series> memory = {{"weights", {}}, {"grads", {}}, {"optimizer", {}},
                                      {"activations", {}}, {"workspace+comm", {}}, {"placement", {}},
                                      {"runtime", {}}};
  std::vector<html::Series> time = {{"step", {}}, {"exposed comm", {}}, {"bubble", {}}};
  for (const auto& s : r.rows) {
    bool has = !s.plan.empty();
    auto cell = [&](double v, int digits) { return has && s.simulated ? fixed(v, digits) : std::string("-"); };
    auto mem = [&](double v) { return has ? gib_cell(v) : std::string("-"); };
    rows.push_back({s.strategy, has ? s.plan : "-", has ? (s.fits ? "yes" : "no") : "-",
                    mem(s.weights_bytes), mem(s.grads_bytes), mem(s.optimizer_bytes),
                    mem(s.activations_bytes), mem(s.workspace_bytes + s.comm_bytes),
                    mem(s.placement_bytes), mem(s.runtime_bytes), mem(s.peak_bytes), cell(s.step_time_s, 3),
                    cell(s.exposed_comm_s, 3), cell(s.bubble_s, 3),
                    has ? gib_cell(s.comm_volume_bytes) : "-", cell(s.mfu, 3),
                    has && s.energy_j ? fixed(*s.energy_j, 0) : std::string("-"), s.note});
    if (moe) {
      rows.back().insert(rows.back().end() - 1,
                         {has ? fixed(s.ep_comm_estimate_s, 3) : "-", has ? fixed(s.imbalance_estimate_s, 3) : "-",
                          cell(s.variability_s, 3)});
    }
    if (!has) continue;
    categories.push_back(s.strategy);
    memory[0].values.push_back(s.weights_bytes / kGiB);
    memory[1].values.push_back(s.grads_bytes / kGiB);
    memory[2].values.push_back(s.optimizer_bytes / kGiB);
    memory[3].values.push_back(s.activations_bytes / kGiB);
    memory[4].values.push_back((s.workspace_bytes + s.comm_bytes) / kGiB);
    memory[5].values.push_back(s.placement_bytes / kGiB);
    memory[6].values.push_back(s.runtime_bytes / kGiB);
    time[0].values.push_back(s.simulated ? s.step_time_s : std::nan(""));
    time[1].values.push_back(s.simulated ? s.exposed_comm_s : std::nan(""));
    time[2].values.push_back(s.simulated ? s.bubble_s : std::nan(""));
  }
  std::string note = "Memory per GPU by class at the peak rank (stepcast memory); step time, exposed "
                     "communication and bubble from simulate --mode " + r.sim_mode + " on the critical rank; "
                     "allowed per device " + gib_cell(r.capacity_bytes) + " GiB." +
                     (moe ? " Experts: a2a est. is the quick estimate's dispatch and combine collectives (ep, etp; "
                            "counted exposed, paced by the busiest ep rank), imbalance est. the expert GEMMs' time on "
                            "the busiest ep rank beyond the ops as lowered (each expert's GEMM at its expected rows: "
                            "the imbalance, and the GEMMs' efficiency at those rows, negative where fewer, larger "
                            "GEMMs run faster), both on the critical stage; variation is "
                            "the simulation's (its routing draws, and run-to-run variation) on the critical rank."
                          : "");
  std::ostringstream md;
  md << note << "\n\n## Strategies\n\n" << markdown_table(headers, rows);
  html::ChartOptions m;
  m.title = "Memory per GPU by class";
  m.x_label = "strategy";
  m.y_label = "GiB";
  html::ChartOptions t;
  t.title = "Simulated step time, exposed communication and bubble";
  t.x_label = "strategy";
  t.y_label = "seconds";
  std::ostringstream body;
  body << html::paragraph(note) << html::table(headers, rows)
       << html::stacked_bars(m, categories, memory) << html::grouped_bars(t, categories, time);
  if (!r.skew_points.empty()) append_skew_section(r.skew_points, md, body);
  write_both(dir, r.title, md.str(), body.str());
}

void write_scale_report(const std::string& dir, const ScaleReport& r) {
  std::vector<std::string> headers = {"nodes", "devices", "plan", "global batch", "step s",
                                      "tokens/s", "speedup", "efficiency", "compute s",
                                      "exposed comm s", "bubble s", "optimizer s", "note"};
  std::vector<std::vector<std::string>> rows;
  html::Line speedup{"speedup", {}, {}}, ideal{"ideal", {}, {}, true}, efficiency{"efficiency", {}, {}};
  std::vector<std::string> categories;
  std::vector<html::Series> terms = {{"compute", {}}, {"exposed comm", {}}, {"bubble", {}},
                                     {"optimizer", {}}};
  double base_devices = 0;
  for (const auto& p : r.points) {
    if (p.error.empty() && base_devices == 0) base_devices = double(p.devices);
  }
  for (const auto& p : r.points) {
    bool ok = p.error.empty();
    auto cell = [&](double v, int digits) { return ok ? fixed(v, digits) : std::string("-"); };
    rows.push_back({std::to_string(p.nodes), std::to_string(p.devices), p.plan,
                    std::to_string(p.global_batch_size), cell(p.step_time_s, 3),
                    cell(p.tokens_per_s, 0), cell(p.speedup, 3), cell(p.efficiency, 3),
                    cell(p.compute_s, 3), cell(p.exposed_comm_s, 3), cell(p.bubble_s, 3),
                    cell(p.optimizer_s, 3), ok ? (p.fits ? "" : "does not fit in memory") : p.error});
    if (!ok) continue;
    speedup.x.push_back(double(p.devices));
    speedup.y.push_back(p.speedup);
    ideal.x.push_back(double(p.devices));
    ideal.y.push_back(double(p.devices) / base_devices);
    efficiency.x.push_back(double(p.devices));
    efficiency.y.push_back(p.efficiency);
    categories.push_back(std::to_string(p.devices));
    terms[0].values.push_back(p.compute_s);
    terms[1].values.push_back(p.exposed_comm_s);
    terms[2].values.push_back(p.bubble_s);
    terms[3].values.push_back(p.optimizer_s);
  }
  std::string note = std::string(r.weak ? "Weak" : "Strong") +
                     " scaling: " + (r.weak ? "the global batch grows with dp_size" : "the global batch is fixed") +
                     "; speedup and efficiency against the smallest run (throughput ratio; "
                     "efficiency = speedup × smallest devices / devices). Amdahl serial fraction "
                     "(least squares on 1/speedup): " +
                     (r.serial_fraction_valid ? fixed(r.serial_fraction, 4) : std::string("n/a")) + ".";
  std::ostringstream md;
  md << note << "\n\n## Scale\n\n" << markdown_table(headers, rows);
  html::ChartOptions s;
  s.title = "Speedup against the smallest run";
  s.x_label = "devices";
  s.y_label = "speedup";
  s.log_x = true;
  html::ChartOptions e = s;
  e.title = "Scaling efficiency";
  e.y_label = "efficiency";
  html::ChartOptions b;
  b.title = "Step time by term (critical rank)";
  b.x_label = "devices";
  b.y_label = "seconds";
  std::ostringstream body;
  body << html::paragraph(note) << html::table(headers, rows)
       << html::line_chart(s, {speedup, ideal}) << html::line_chart(e, {efficiency})
       << html::stacked_bars(b, categories, terms);
  write_both(dir, r.title, md.str(), body.str());
}

}  // namespace stepcast::cli
