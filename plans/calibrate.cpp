// Calibration: Megatron-LM logs, the parameter set, and the fit; see calibrate.hpp.
#include "calibrate.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "errors.hpp"

namespace stepcast {

namespace {

bool truthy(const std::string& v) { return v == "True" || v == "true" || v == "1"; }

bool parse_int(const std::string& s, int64_t& out) {
  try {
    size_t used = 0;
    out = std::stoll(s, &used);
    return used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

// "  tensor_model_parallel_size ...... 8" (Megatron's arguments block): the name and the value.
std::optional<std::pair<std::string, std::string>> argument_line(const std::string& line) {
  size_t begin = line.find_first_not_of(" \t");
  if (begin == std::string::npos) return std::nullopt;
  size_t end = line.find_first_not_of("abcdefghijklmnopqrstuvwxyz_0123456789", begin);
  if (end == begin || end == std::string::npos || line[end] != ' ') return std::nullopt;
  size_t dots_end = line.find_first_not_of('.', end + 1);
  if (dots_end == std::string::npos || dots_end - (end + 1) < 2 || line[dots_end] != ' ') return std::nullopt;
  size_t value_begin = dots_end + 1, value_end = line.find_last_not_of(" \t\r");
  std::string value = value_end == std::string::npos || value_end < value_begin
                          ? std::string()
                          : line.substr(value_begin, value_end + 1 - value_begin);
  return std::make_pair(line.substr(begin, end - begin), value);
}

// "--tensor-model-parallel-size 8 --sequence-parallel --lr=1e-4": each flag (dashes as
// underscores) and its value ("True" for a flag without one). A value is the next word, or what
// follows '=', unless it starts with '-'.
std::vector<std::pair<std::string, std::string>> launch_flags(const std::string& line) {
  std::vector<std::pair<std::string, std::string>> out;
  std::vector<std::string> words;
  std::istringstream in(line);
  for (std::string word; in >> word;) words.push_back(word);
  auto is_name = [](const std::string& s) {
    return !s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos &&
           s[0] != '-';
  };
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i].rfind("--", 0) != 0) continue;
    std::string name = words[i].substr(2), value;
    if (size_t equals = name.find('='); equals != std::string::npos) {
      value = name.substr(equals + 1);
      name = name.substr(0, equals);
    } else if (i + 1 < words.size() && words[i + 1][0] != '-') {
      value = words[++i];
    }
    if (!is_name(name)) continue;
    std::replace(name.begin(), name.end(), '-', '_');
    out.emplace_back(name, value.empty() || value[0] == '-' ? "True" : value);
  }
  return out;
}

}  // namespace

MegatronLog parse_megatron_log(const std::string& text, const std::string& file) {
  MegatronLog log;
  log.file = file;
  std::map<std::string, std::string> args;  // Megatron's argument names (underscores)
  std::istringstream in(text);
  bool in_args = false;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find("arguments ---") != std::string::npos || line.find("--- arguments") != std::string::npos) {
      in_args = line.find("end of arguments") == std::string::npos;
      continue;
    }
    if (in_args) {
      if (std::optional<std::pair<std::string, std::string>> arg = argument_line(line)) {
        args[arg->first] = arg->second;
        continue;
      }
    }
    static const std::string iteration = "elapsed time per iteration (ms):";
    if (size_t at = line.find(iteration); at != std::string::npos) {
      at = std::min(line.find_first_not_of(" \t", at + iteration.size()), line.size());
      std::string number = line.substr(at, std::min(line.find_first_not_of("0123456789.eE+-", at), line.size()) - at);
      double ms = 0;
      try {
        ms = std::stod(number);
      } catch (const std::exception&) {
        ms = -1;
      }
      if (!(ms > 0) || !std::isfinite(ms)) {
        throw InputError(file + ":" + std::to_string(line_no) + ": elapsed time per iteration '" +
                         printable_excerpt(number) + "'; valid: a positive number of milliseconds");
      }
      log.iteration_times_s.push_back(ms / 1e3);
      continue;
    }
    // A launch line: --tensor-model-parallel-size 8 --sequence-parallel ...
    if (line.find("pretrain") != std::string::npos || line.rfind("--", line.find_first_not_of(" \t")) == 0) {
      for (const auto& [name, value] : launch_flags(line)) args.emplace(name, value);
    }
  }
  if (log.iteration_times_s.empty()) {
    throw InputError(file + ": no 'elapsed time per iteration (ms)' lines; valid: a Megatron-LM "
                     "training log with at least one logged iteration (two or more: the first is warm-up)");
  }
  auto get = [&](const std::string& name) -> std::optional<std::string> {
    auto it = args.find(name);
    if (it == args.end() || it->second == "None") return std::nullopt;
    return it->second;
  };
  auto integer = [&](const std::string& name, std::optional<int64_t> fallback) -> int64_t {
    std::optional<std::string> v = get(name);
    if (!v) {
      if (fallback) return *fallback;
      throw InputError(file + ": Megatron argument '" + name + "' is missing; valid: a log with "
                       "Megatron's arguments block or launch line");
    }
    int64_t out = 0;
    if (!parse_int(*v, out) || out < 1) {
      throw InputError(file + ": Megatron argument '" + name + "' = '" + *v + "'; valid: a positive integer");
    }
    return out;
  };
  int64_t tp = integer("tensor_model_parallel_size", 1), pp = integer("pipeline_model_parallel_size", 1);
  log.world_size = integer("world_size", std::nullopt);
  if (tp > log.world_size || pp > log.world_size / tp || log.world_size % (tp * pp) != 0) {
    throw InputError(file + ": world_size " + std::to_string(log.world_size) + " is not a multiple of "
                     "tensor parallel size " + std::to_string(tp) + " × pipeline parallel size " +
                     std::to_string(pp) + "; valid: a consistent log");
  }
  Json plan = {{"name", "megatron-log"},
               {"tp_size", tp},
               {"pp_size", pp},
               {"dp_size", log.world_size / (tp * pp)},
               {"micro_batch_size", integer("micro_batch_size", std::nullopt)},
               {"global_batch_size", integer("global_batch_size", std::nullopt)}};
  if (get("num_layers_per_virtual_pipeline_stage") || get("virtual_pipeline_model_parallel_size")) {
    int64_t layers = integer("num_layers", std::nullopt);
    int64_t vpp = get("virtual_pipeline_model_parallel_size")
                      ? integer("virtual_pipeline_model_parallel_size", std::nullopt)
                      : layers / pp / integer("num_layers_per_virtual_pipeline_stage", std::nullopt);
    if (vpp > 1) {
      plan["schedule"] = "interleaved_1f1b";
      plan["virtual_pp_size"] = vpp;
    }
  }
  std::string granularity = get("recompute_granularity").value_or(get("recompute_activations") &&
                                                                           truthy(*get("recompute_activations"))
                                                                       ? "selective"
                                                                       : "");
  if (granularity == "full" || granularity == "selective") plan["recompute"] = granularity;
  if (get("sequence_parallel") && truthy(*get("sequence_parallel"))) plan["sequence_parallel"] = true;
  if (get("use_distributed_optimizer") && truthy(*get("use_distributed_optimizer"))) {
    plan["zero_stage"] = 1;
    // Printed by every Megatron-LM that has partial distributed optimizers (1 when unused).
    if (get("num_distributed_optimizer_instances")) {
      plan["num_distributed_optimizer_instances"] = integer("num_distributed_optimizer_instances", std::nullopt);
    }
  }
  if (get("bf16") && truthy(*get("bf16"))) plan["dtype"] = "bf16";
  if (get("fp16") && truthy(*get("fp16"))) plan["dtype"] = "fp16";
  if ((get("use_flash_attn") && truthy(*get("use_flash_attn"))) ||
      get("attention_backend").value_or("") == "flash" || get("attention_backend").value_or("") == "fused") {
    plan["attention_impl"] = "flash";
  }
  if (get("hidden_dropout")) {
    try {
      plan["dropout"] = std::stod(*get("hidden_dropout"));
    } catch (const std::exception&) {
      throw InputError(file + ": Megatron argument 'hidden_dropout' = '" + *get("hidden_dropout") +
                       "'; valid: a number");
    }
  }
  if (get("overlap_grad_reduce") && truthy(*get("overlap_grad_reduce"))) plan["overlap_grad_reduce"] = true;
  if (get("overlap_param_gather") && truthy(*get("overlap_param_gather"))) plan["overlap_param_gather"] = true;
  // Printed after Megatron's own rule (false unless the schedule is interleaved).
  if (get("overlap_p2p_comm")) plan["overlap_p2p_comm"] = truthy(*get("overlap_p2p_comm"));
  // Megatron-LM v2/v3 print it (on by default); v3 skips it under sequence parallelism, which
  // already splits the transfer.
  if (get("scatter_gather_tensors_in_pipeline") && !plan.value("sequence_parallel", false)) {
    plan["scatter_gather_tensors_in_pipeline"] = truthy(*get("scatter_gather_tensors_in_pipeline"));
  }
  if (get("seq_length")) log.seq_length = integer("seq_length", std::nullopt);
  log.plan = plan;
  std::vector<double> steady(log.iteration_times_s.begin() + (log.iteration_times_s.size() > 1 ? 1 : 0),
                             log.iteration_times_s.end());
  std::sort(steady.begin(), steady.end());
  size_t n = steady.size();
  log.step_time_s = n % 2 ? steady[n / 2] : 0.5 * (steady[n / 2 - 1] + steady[n / 2]);
  return log;
}

const char* to_string(CalibrationParam p) {
  switch (p) {
    case CalibrationParam::gemm: return "gemm";
    case CalibrationParam::memory: return "memory";
    case CalibrationParam::links: return "links";
    case CalibrationParam::overhead: return "overhead";
    case CalibrationParam::jitter: return "jitter";
  }
  return "?";
}

std::vector<CalibrationParam> parse_calibration_params(const std::string& list) {
  std::vector<CalibrationParam> out;
  std::stringstream s(list);
  for (std::string name; std::getline(s, name, ',');) {
    bool found = false;
    for (CalibrationParam p : {CalibrationParam::gemm, CalibrationParam::memory, CalibrationParam::links,
                               CalibrationParam::overhead, CalibrationParam::jitter}) {
      if (name == to_string(p)) {
        if (std::find(out.begin(), out.end(), p) != out.end()) {
          throw InputError("command line: --params names '" + name + "' twice; valid: each once");
        }
        out.push_back(p);
        found = true;
      }
    }
    if (!found) {
      throw InputError("command line: --params '" + name + "'; valid: gemm, memory, links, overhead, jitter");
    }
  }
  if (out.empty()) throw InputError("command line: --params is empty; valid: gemm, memory, links, overhead, jitter");
  return out;
}

double Calibration::get(CalibrationParam p) const {
  switch (p) {
    case CalibrationParam::gemm: return gemm_scale;
    case CalibrationParam::memory: return memory_scale;
    case CalibrationParam::links: return link_scale;
    case CalibrationParam::overhead: return overhead_s;
    case CalibrationParam::jitter: return device_speed_cv;
  }
  return 0;
}

void Calibration::set(CalibrationParam p, double value) {
  switch (p) {
    case CalibrationParam::gemm: gemm_scale = value; break;
    case CalibrationParam::memory: memory_scale = value; break;
    case CalibrationParam::links: link_scale = value; break;
    case CalibrationParam::overhead: overhead_s = value; break;
    case CalibrationParam::jitter: device_speed_cv = value; break;
  }
}

Calibration calibration_of(const DeviceProfile& base) {
  Calibration c;
  c.device_speed_cv = base.variability.device_speed_cv;
  return c;
}

DeviceProfile apply_calibration(DeviceProfile p, const Calibration& c) {
  auto fraction = [](double f, double s) { return std::min(1.0, f * s); };
  for (auto& [dtype, e] : p.gemm) {
    e.peak_fraction = fraction(e.peak_fraction, c.gemm_scale);
    if (e.ceiling_fraction > 0) e.ceiling_fraction = fraction(e.ceiling_fraction, c.gemm_scale);
    e.overhead_s += c.overhead_s;
  }
  p.flash_forward_peak_fraction = fraction(p.flash_forward_peak_fraction, c.gemm_scale);
  p.flash_backward_peak_fraction = fraction(p.flash_backward_peak_fraction, c.gemm_scale);
  p.memory_bandwidth_fraction = fraction(p.memory_bandwidth_fraction, c.memory_scale);
  if (p.memory_bandwidth_bytes_per_s) *p.memory_bandwidth_bytes_per_s *= c.memory_scale;
  p.kernel_overhead_s += c.overhead_s;
  p.intra_node_bus_fraction = fraction(p.intra_node_bus_fraction, c.link_scale);
  p.inter_node_bus_fraction = fraction(p.inter_node_bus_fraction, c.link_scale);
  if (p.inter_node_exchange_fraction) {
    p.inter_node_exchange_fraction = fraction(*p.inter_node_exchange_fraction, c.link_scale);
  }
  for (InterNodeAtRate& at : p.inter_node_at_rates) {
    at.bus_fraction = fraction(at.bus_fraction, c.link_scale);
    if (at.exchange_fraction) at.exchange_fraction = fraction(*at.exchange_fraction, c.link_scale);
  }
  if (p.intra_node_bandwidth_bytes_per_s) *p.intra_node_bandwidth_bytes_per_s *= c.link_scale;
  p.variability.device_speed_cv = c.device_speed_cv;
  if (p.measured) {
    MeasuredTables& t = *p.measured;
    // Measured times include their fixed costs; the overhead adds to them too.
    for (auto* list : {&t.gemm, &t.gemm_reuse}) {
      for (GemmPoint& g : *list) g.time_s = g.time_s / c.gemm_scale + c.overhead_s;
    }
    for (MemoryPoint& m : t.memory) m.time_s = m.time_s / c.memory_scale + c.overhead_s;
    for (AttentionPoint& a : t.attention) a.flops_per_s *= c.gemm_scale;
    for (auto* list : {&t.collectives, &t.collective_reuse}) {
      for (CollectivePoint& col : *list) {
        col.time_s /= c.link_scale;
        col.algbw_bytes_per_s *= c.link_scale;
        col.busbw_bytes_per_s *= c.link_scale;
      }
    }
    for (P2pPoint& q : t.p2p) q.time_s /= c.link_scale;
    for (P2pPoint& q : t.p2p_inter_node) q.time_s /= c.link_scale;
  }
  return p;
}

namespace {

// How a parameter is fitted: θ = log(s) for scales, the value itself otherwise; its
// finite-difference step and bounds in θ.
struct Coordinate {
  CalibrationParam param;
  bool logarithmic;
  double step, lo, hi;
};

Coordinate coordinate_of(CalibrationParam p) {
  switch (p) {
    case CalibrationParam::overhead: return {p, false, 2e-6, 0, 1e-3};
    case CalibrationParam::jitter: return {p, false, 0.01, 0, 0.3};
    default: return {p, true, 0.05, std::log(0.1), std::log(10.0)};
  }
}

// Solves A x = b (n ≤ 5) by Gaussian elimination with partial pivoting.
std::vector<double> solve(std::vector<std::vector<double>> a, std::vector<double> b) {
  const size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    std::swap(a[c], a[pivot]);
    std::swap(b[c], b[pivot]);
    if (std::abs(a[c][c]) < 1e-300) continue;
    for (size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      double f = a[r][c] / a[c][c];
      for (size_t k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  std::vector<double> x(n, 0.0);
  for (size_t i = 0; i < n; ++i) x[i] = std::abs(a[i][i]) < 1e-300 ? 0 : b[i] / a[i][i];
  return x;
}

}  // namespace

CalibrationLimits calibration_limits(const DeviceProfile& base, const DeviceSpec& device) {
  CalibrationLimits l;
  if (base.backend == "cpu" || !base.measured) return l;  // as check_points_within_peaks
  const MeasuredTables& t = *base.measured;
  auto peak = device.peak_flops_per_s.find(t.dtype);
  if (peak != device.peak_flops_per_s.end()) {
    for (const GemmPoint& g : t.gemm) l.gemm_scale_max = std::min(l.gemm_scale_max, g.time_s * peak->second / g.flops());
    for (const AttentionPoint& a : t.attention) l.gemm_scale_max = std::min(l.gemm_scale_max, peak->second / a.flops_per_s);
  }
  for (const MemoryPoint& m : t.memory) {
    l.memory_scale_max = std::min(l.memory_scale_max, m.time_s * device.memory_bandwidth_bytes_per_s / m.bytes);
  }
  return l;
}

CalibrationResult calibrate(const Calibration& base, const std::vector<CalibrationParam>& params,
                            const std::vector<double>& measured_s, const StepEvaluator& evaluate,
                            const CalibrationLimits& limits) {
  STEPCAST_CHECK(!measured_s.empty() && !params.empty(), "calibrate without runs or parameters");
  const size_t runs = measured_s.size(), n = params.size();
  std::vector<Coordinate> coords;
  for (CalibrationParam p : params) {
    Coordinate k = coordinate_of(p);
    if (p == CalibrationParam::gemm) k.hi = std::min(k.hi, std::log(std::max(limits.gemm_scale_max, 0.1)));
    if (p == CalibrationParam::memory) k.hi = std::min(k.hi, std::log(std::max(limits.memory_scale_max, 0.1)));
    coords.push_back(k);
  }
  auto theta_of = [&](const Calibration& c) {
    std::vector<double> t;
    for (const Coordinate& k : coords) {
      double v = c.get(k.param);
      t.push_back(k.logarithmic ? std::log(v) : v);
    }
    return t;
  };
  auto calibration_at = [&](const std::vector<double>& t) {
    Calibration c = base;
    for (size_t j = 0; j < n; ++j) {
      double v = std::clamp(t[j], coords[j].lo, coords[j].hi);
      c.set(coords[j].param, coords[j].logarithmic ? std::exp(v) : v);
    }
    return c;
  };
  auto clamp_theta = [&](std::vector<double> t) {
    for (size_t j = 0; j < n; ++j) t[j] = std::clamp(t[j], coords[j].lo, coords[j].hi);
    return t;
  };
  const std::vector<double> theta0 = theta_of(base);
  // A weak pull towards the base, in units of each coordinate's step: 1e-7 · (Δθ/step)², next to
  // squared log errors of 1e-4 and up: it decides only directions the runs do not.
  const double prior = 1e-7;
  auto residuals = [&](const std::vector<double>& predicted) {
    std::vector<double> r(runs);
    for (size_t i = 0; i < runs; ++i) r[i] = std::log(predicted[i] / measured_s[i]);
    return r;
  };
  auto cost = [&](const std::vector<double>& r, const std::vector<double>& t) {
    double c = 0;
    for (double x : r) c += x * x;
    for (size_t j = 0; j < n; ++j) c += prior * std::pow((t[j] - theta0[j]) / coords[j].step, 2);
    return c;
  };
  CalibrationResult result;
  // The point and its Jacobian in one batch.
  auto linearise = [&](const std::vector<double>& t, std::vector<double>& r,
                       std::vector<std::vector<double>>& jacobian) {
    std::vector<Calibration> settings = {calibration_at(t)};
    for (size_t j = 0; j < n; ++j) {
      std::vector<double> shifted = t;
      shifted[j] += coords[j].step;
      if (shifted[j] > coords[j].hi) shifted[j] = t[j] - coords[j].step;
      settings.push_back(calibration_at(shifted));
    }
    std::vector<std::vector<double>> predicted = evaluate(settings, {});
    result.evaluations += int(settings.size());
    r = residuals(predicted[0]);
    jacobian.assign(runs, std::vector<double>(n, 0.0));
    for (size_t j = 0; j < n; ++j) {
      double step = std::clamp(t[j] + coords[j].step, coords[j].lo, coords[j].hi) == t[j] + coords[j].step
                        ? coords[j].step
                        : -coords[j].step;
      std::vector<double> rj = residuals(predicted[j + 1]);
      for (size_t i = 0; i < runs; ++i) jacobian[i][j] = (rj[i] - r[i]) / step;
    }
    return predicted[0];
  };
  // Normal equations with the prior, damping λ, optionally without one run.
  auto step_from = [&](const std::vector<double>& t, const std::vector<double>& r,
                       const std::vector<std::vector<double>>& jac, double lambda, int64_t skip) {
    std::vector<std::vector<double>> a(n, std::vector<double>(n, 0.0));
    std::vector<double> b(n, 0.0);
    for (size_t i = 0; i < runs; ++i) {
      if (int64_t(i) == skip) continue;
      for (size_t j = 0; j < n; ++j) {
        b[j] -= jac[i][j] * r[i];
        for (size_t k = 0; k < n; ++k) a[j][k] += jac[i][j] * jac[i][k];
      }
    }
    for (size_t j = 0; j < n; ++j) {
      double w = prior / (coords[j].step * coords[j].step);
      a[j][j] += w + lambda * (a[j][j] + w);
      b[j] -= w * (t[j] - theta0[j]);
    }
    std::vector<double> delta = solve(a, b);
    std::vector<double> next = t;
    for (size_t j = 0; j < n; ++j) next[j] += delta[j];
    return clamp_theta(next);
  };

  std::vector<double> theta = theta0, r;
  std::vector<std::vector<double>> jac;
  result.before_s = linearise(theta, r, jac);
  double current = cost(r, theta);
  double lambda = 1e-3;
  for (result.iterations = 0; result.iterations < 12; ++result.iterations) {
    std::vector<double> candidate = step_from(theta, r, jac, lambda, -1);
    double moved = 0;
    for (size_t j = 0; j < n; ++j) moved = std::max(moved, std::abs(candidate[j] - theta[j]) / coords[j].step);
    if (moved < 1e-3) break;
    std::vector<double> rc;
    std::vector<std::vector<double>> jc;
    std::vector<double> predicted = linearise(candidate, rc, jc);
    double c = cost(rc, candidate);
    if (c < current) {
      theta = candidate;
      r = rc;
      jac = jc;
      current = c;
      lambda = std::max(1e-6, lambda / 3);
      result.after_s = predicted;
    } else {
      lambda *= 10;
    }
  }
  if (result.after_s.empty()) result.after_s = result.before_s;
  result.fitted = calibration_at(theta);
  // Leave one out: refit without each run from the final linearisation, then predict it.
  if (runs > 1) {
    std::vector<Calibration> held_out;
    std::vector<int64_t> only;
    for (size_t i = 0; i < runs; ++i) {
      held_out.push_back(calibration_at(step_from(theta, r, jac, 0, int64_t(i))));
      only.push_back(int64_t(i));
    }
    std::vector<std::vector<double>> predicted = evaluate(held_out, only);
    result.evaluations += int(held_out.size());
    for (size_t i = 0; i < runs; ++i) result.leave_one_out_s.push_back(predicted[i][i]);
  }
  return result;
}

}  // namespace stepcast
