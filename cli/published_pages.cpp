// published.md and published.html: the same rows as published.json, for reading; see
// published_report.hpp.
#include "published_report.hpp"

#include <sstream>

#include "html.hpp"
#include "version.hpp"

namespace stepcast::cli {

namespace {

std::string plan_summary(const MegatronRow& row) {
  std::ostringstream out;
  out << "tp " << row.tp << " pp " << row.pp << " dp " << row.dp();
  int64_t v = megatron_virtual_pp_size(row);
  if (v > 1) out << ", interleaved v " << v;
  else if (row.pp > 1) out << ", 1F1B";
  out << ", mb " << row.micro_batch << ", " << row.batch / row.dp() / row.micro_batch
      << " microbatches, " << row.ddp_impl << " DDP, full recompute";
  return out.str();
}

std::string row_config(const MegatronRow& row) {
  std::ostringstream out;
  out << row.params_billion << "B: h " << row.hidden << ", l " << row.layers << ", a " << row.heads
      << ", B " << row.batch << ", " << row.gpus << " GPUs";
  return out.str();
}

double breakdown_value(const Json& breakdown, const char* key) {
  return breakdown.contains(key) ? breakdown.at(key).get<double>() : 0.0;
}

std::string md_cell(std::string s) {
  for (size_t i = 0; (i = s.find('|', i)) != std::string::npos; i += 2) s.replace(i, 1, "\\|");
  return s;
}

}  // namespace

std::string published_report_markdown(const PublishedReport& report) {
  std::ostringstream md;
  md << "# Published multi-GPU results: predicted against published\n\n"
     << "`stepcast validate --sweep published`: rows from `data/published.json` (each with its published source), "
     << "predicted from the shipped datasheet profiles, never fitted to these results. "
     << "Error = (predicted − published) / published; means are of absolute errors.\n\n"
     << "Made on " << report.created_utc << ", stepcast " << stepcast_version() << " (git "
     << stepcast_git_commit() << "), machine " << report.machine.hostname << " ("
     << report.machine.cpu_model << ", " << report.machine.cores << " cores), in "
     << fixed_or_na(report.wall_s, 0) << " s.\n\nProfiles:";
  for (const auto& p : report.profiles) {
    md << " `" << p.at("file").get<std::string>() << "` (" << p.at("name").get<std::string>() << ")";
  }
  md << ".\n\n## Megatron-LM SC'21 Table 1 (throughput per GPU)\n\n"
     << "Topology `topologies/dgx-a100-80gb.json` with `--nodes` = GPUs / 8, profile "
     << "`profiles/a100-sxm4-80gb.json`, `simulate --mode fast`. TFLOP/s per GPU = eq. 3's FLOPs "
     << "(recompute counted, as the paper counts them) / (predicted iteration time × GPUs); the "
     << "published iteration time is eq. 3 / (published TFLOP/s × GPUs).\n\n"
     << "Plan rule: " << megatron_plan_rule() << "\n\n"
     << "| row | config | plan | predicted TFLOP/s/GPU | predicted iteration s | published "
        "TFLOP/s/GPU | published iteration s | error | compute / exposed comm / bubble / optimizer / "
        "variability / overlap interference s | fits |\n"
     << "|---|---|---|---:|---:|---:|---:|---:|---|---|\n";
  auto parts = [](const Json& b) {
    return fixed_or_na(breakdown_value(b, "compute"), 2) + " / " + fixed_or_na(breakdown_value(b, "exposed_comm"), 2) +
           " / " + fixed_or_na(breakdown_value(b, "bubble"), 2) + " / " + fixed_or_na(breakdown_value(b, "optimizer"), 2) +
           " / " + fixed_or_na(breakdown_value(b, "variability"), 2) + " / " +
           fixed_or_na(breakdown_value(b, "overlap_interference"), 2);
  };
  for (const auto& r : report.megatron) {
    const MegatronRow& row = *r.row;
    md << "| " << row.name << " | " << row_config(row) << " | " << plan_summary(row) << " | ";
    if (r.ok) {
      md << fixed_or_na(r.tflops_per_gpu, 1) << " | " << fixed_or_na(r.step_time_s, 2) << " | "
         << fixed_or_na(row.published_tflops_per_gpu, 0) << " | " << fixed_or_na(r.published_time_s(), 2)
         << " | " << signed_percent(r.error()) << " | " << parts(r.breakdown) << " | "
         << (r.fits ? "yes" : "NO") << " |\n";
    } else {
      md << "failed | | " << fixed_or_na(row.published_tflops_per_gpu, 0) << " | "
         << fixed_or_na(r.published_time_s(), 2) << " | | " << md_cell(r.failure.substr(0, 200))
         << " | |\n";
    }
  }
  md << "\nMean absolute error over the Table 1 rows: **" << fixed_or_na(100 * report.megatron_mean(), 1) << "%**.\n";
  if (!report.baseline.is_null()) {
    md << "\n### Before and after\n\nBefore: " << report.baseline_file << ". Breakdown parts in seconds: "
       << "compute / exposed comm / bubble / optimizer / variability.\n\n"
       << "| row | error before | error now | breakdown before | breakdown now |\n|---|---:|---:|---|---|\n";
    for (const auto& r : report.megatron) {
      if (!r.ok || !report.baseline.contains(r.row->name)) continue;
      const Json& b = report.baseline.at(r.row->name);
      md << "| " << r.row->name << " | " << signed_percent(b.at("error").get<double>()) << " | " << signed_percent(r.error())
         << " | " << parts(b.at("breakdown_s")) << " | " << parts(r.breakdown) << " |\n";
    }
  }
  md << "\n## nccl-tests all_reduce bus bandwidth\n\n"
     << "Predicted by the collective cost model (`plans/collective_cost.hpp`: the algorithm lowering "
     << "would choose and its α-β time on the topology after the profile's link fractions, times the "
     << "correction of the profile's measured table nearest in span, named in the algorithm column); "
     << "busbw = algbw · 2(n−1)/n (nccl-tests).\n\n"
     << "| row | system | source | message | algorithm | predicted busbw GB/s | published GB/s | "
        "error | in mean |\n"
     << "|---|---|---|---|---|---:|---:|---:|---|\n";
  for (const auto& r : report.nccl) {
    const NcclRow& row = *r.row;
    md << "| " << row.name << " | " << md_cell(row.system) << " | " << md_cell(row.source) << " | "
       << md_cell(row.bytes_note) << " | " << r.predicted.algorithm << " | "
       << fixed_or_na(r.predicted.busbw_bytes_per_s / 1e9, 1) << " | "
       << fixed_or_na(row.published_busbw_bytes_per_s / 1e9, 1) << " | " << signed_percent(r.error()) << " | "
       << (row.excluded.empty() ? "yes" : "no: " + md_cell(row.excluded)) << " |\n";
  }
  md << "\nMean absolute error over the nccl-tests rows in the mean: **"
     << fixed_or_na(100 * report.nccl_mean(), 1) << "%**. Over every row in a mean: **"
     << fixed_or_na(100 * report.overall_mean(), 1) << "%**.\n";
  md << "\n## Component figures of the profiles\n\nEvery published component figure a profile holds, "
     << "predicted by the cost model that uses it (`plans/components.hpp`): GEMM points the shape model was "
     << "fitted to, by the model; table points (GEMM grids, memory-bound kernels, fused attention, "
     << "collectives), each by its table without it (leave-one-out; an nccl-tests point beyond the rest of its "
     << "table as the collective cost model extrapolates: the nearest size's correction times NCCL's model, "
     << "the ring or across nodes the tree where faster). Error = (predicted − measured) / measured time; "
     << "sources are the keys of the profile's `sources`.\n";
  for (const ComponentSection& c : report.components) {
    md << "\n### `" << c.profile_file << "` (on `" << c.topology_file << "`)\n\n"
       << "| family | points | median abs error | largest abs error |\n|---|---:|---:|---:|\n";
    for (const auto& [family, t] : c.summary()) {
      md << "| " << family << " | " << t.points << " | " << fixed_or_na(100 * t.median_abs_error, 1) << "% | "
         << fixed_or_na(100 * t.largest_abs_error, 1) << "% |\n";
    }
    md << "\n<details><summary>every point</summary>\n\n| family | figure | source | method | measured us | "
          "predicted us | error |\n|---|---|---|---|---:|---:|---:|\n";
    for (const ComponentCheck& k : c.checks) {
      md << "| " << k.family << " | " << md_cell(k.what) << " | " << k.source << " | " << k.method << " | "
         << fixed_or_na(k.measured_s * 1e6, 2) << " | " << fixed_or_na(k.predicted_s * 1e6, 2) << " | "
         << signed_percent(k.relative_error()) << " |\n";
    }
    md << "\n</details>\n";
  }
  return md.str();
}

std::string published_report_html(const PublishedReport& report) {
  using namespace stepcast::html;
  std::ostringstream body;
  body << heading("Published multi-GPU results: predicted against published", 1)
       << paragraph("stepcast validate --sweep published, " + report.created_utc + ", stepcast " +
                    stepcast_version() + " (git " + stepcast_git_commit() + "), machine " +
                    report.machine.hostname + " (" + report.machine.cpu_model + ", " +
                    std::to_string(report.machine.cores) + " cores). Rows from "
                    "data/published.json (each row with its published source), predicted from the shipped datasheet "
                    "profiles, never fitted to them. Error = (predicted - published) / published.");
  std::vector<Point> points;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> categories;
  std::vector<double> compute, comm, bubble, optimizer;
  for (const auto& r : report.megatron) {
    const MegatronRow& row = *r.row;
    if (r.ok) {
      points.push_back({row.published_tflops_per_gpu, r.tflops_per_gpu, row.name});
      categories.push_back(row.name);
      compute.push_back(breakdown_value(r.breakdown, "compute"));
      comm.push_back(breakdown_value(r.breakdown, "exposed_comm"));
      bubble.push_back(breakdown_value(r.breakdown, "bubble"));
      optimizer.push_back(breakdown_value(r.breakdown, "optimizer"));
    }
    rows.push_back({row.name, row_config(row), plan_summary(row),
                    r.ok ? fixed_or_na(r.tflops_per_gpu, 1) : "failed",
                    r.ok ? fixed_or_na(r.step_time_s, 2) : "", fixed_or_na(row.published_tflops_per_gpu, 0),
                    fixed_or_na(r.published_time_s(), 2), r.ok ? signed_percent(r.error()) : r.failure});
  }
  body << heading("Megatron-LM SC'21 Table 1: TFLOP/s per GPU")
       << paragraph("Plan rule: " + megatron_plan_rule())
       << table({"row", "config", "plan", "predicted TFLOP/s/GPU", "predicted iteration s",
                 "published TFLOP/s/GPU", "published iteration s", "error"},
                rows)
       << paragraph("Mean absolute error: " + fixed_or_na(100 * report.megatron_mean(), 1) + "%.");
  ChartOptions scatter;
  scatter.title = "TFLOP/s per GPU: predicted against published (band ±10%)";
  scatter.x_label = "published TFLOP/s per GPU";
  scatter.y_label = "predicted TFLOP/s per GPU";
  body << scatter_chart(scatter, points, 0.10);
  ChartOptions bars;
  bars.title = "Predicted iteration time by part (critical rank)";
  bars.x_label = "row";
  bars.y_label = "seconds";
  body << stacked_bars(bars, categories,
                       {{"compute", compute}, {"exposed comm", comm}, {"bubble", bubble},
                        {"optimizer", optimizer}});
  std::vector<std::vector<std::string>> nccl_rows;
  std::vector<Point> nccl_points;
  for (const auto& r : report.nccl) {
    const NcclRow& row = *r.row;
    nccl_rows.push_back({row.name, row.system, row.source, row.bytes_note, r.predicted.algorithm,
                         fixed_or_na(r.predicted.busbw_bytes_per_s / 1e9, 1),
                         fixed_or_na(row.published_busbw_bytes_per_s / 1e9, 1), signed_percent(r.error()),
                         row.excluded.empty() ? "yes" : "no: " + row.excluded});
    nccl_points.push_back({row.published_busbw_bytes_per_s / 1e9, r.predicted.busbw_bytes_per_s / 1e9,
                           row.name});
  }
  body << heading("nccl-tests all_reduce bus bandwidth")
       << table({"row", "system", "source", "message", "algorithm", "predicted busbw GB/s",
                 "published GB/s", "error", "in mean"},
                nccl_rows)
       << paragraph("Mean absolute error over the rows in the mean: " +
                    fixed_or_na(100 * report.nccl_mean(), 1) + "%; over every row in a mean: " +
                    fixed_or_na(100 * report.overall_mean(), 1) + "%.");
  ChartOptions busbw;
  busbw.title = "all_reduce busbw: predicted against published (band ±10%)";
  busbw.x_label = "published GB/s";
  busbw.y_label = "predicted GB/s";
  body << scatter_chart(busbw, nccl_points, 0.10);
  std::vector<std::vector<std::string>> component_rows;
  for (const ComponentSection& c : report.components) {
    for (const auto& [family, t] : c.summary()) {
      component_rows.push_back({c.profile_file, family, std::to_string(t.points),
                                fixed_or_na(100 * t.median_abs_error, 1) + "%", fixed_or_na(100 * t.largest_abs_error, 1) + "%"});
    }
  }
  body << heading("Component figures of the profiles")
       << paragraph("Each published component figure a profile holds, predicted by the cost model that uses "
                    "it: fitted GEMM points by the model, table points by their table without them "
                    "(leave-one-out; an nccl-tests point beyond the rest of its table as the collective "
                    "cost model extrapolates). published.md lists every point with its source.")
       << table({"profile", "family", "points", "median abs error", "largest abs error"}, component_rows);
  return page("stepcast: published results", body.str());
}


}  // namespace stepcast::cli
