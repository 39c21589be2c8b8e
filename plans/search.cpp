// The planner's enumeration, pruning, ranking and search; see search.hpp.
#include "search.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "energy.hpp"
#include "errors.hpp"
#include "lower.hpp"
#include "memory.hpp"
#include "pruned_reasons.hpp"
#include "units.hpp"

namespace stepcast {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

Dtype search_dtype(const Topology& topology) {
  const auto& peaks = topology.node.device.peak_flops_per_s;
  return peaks.count(Dtype::bf16) ? Dtype::bf16 : Dtype::fp32;
}

}  // namespace

std::string plan_name(const Plan& plan) {
  std::ostringstream out;
  out << "tp" << plan.tp_size;
  if (plan.cp_size > 1) out << "-cp" << plan.cp_size;
  if (plan.cp_size > 1 && plan.cp_comm_type != CpCommType::p2p) {
    out << (plan.cp_comm_type == CpCommType::a2a ? "-a2a" : "-ag");
  }
  out << "-pp" << plan.pp_size << "-dp" << plan.dp_size << "-z"
      << plan.zero_stage << "-mbs" << plan.micro_batch_size << "-";
  if (plan.schedule == ScheduleKind::interleaved_1f1b) out << "vpp" << plan.virtual_pp_size;
  else out << to_string(plan.schedule);
  if (plan.recompute != RecomputeKind::none) out << "-" << to_string(plan.recompute);
  if (plan.sequence_parallel) out << "-sp";
  if (plan.attention_impl == AttentionImpl::flash) out << "-flash";
  if (plan.num_distributed_optimizer_instances > 1) out << "-shard" << plan.dp_shard_size();
  if (plan.fp8.enabled()) out << "-fp8" << (plan.fp8.format == Fp8Format::hybrid ? "h" : "");
  if (plan.fp8.current()) out << "-tw";
  if (plan.fp8.mx()) out << "-mx";
  if (plan.fp8.blockwise()) out << "-bw";
  if (plan.fp8.param_gather) out << "-pg";
  if (plan.moe.top_k > 0) {
    out << "-ep" << plan.moe.ep_size;
    if (plan.moe.etp_size != plan.tp_size) out << "-etp" << plan.moe.etp_size;
    if (plan.moe.dispatcher == MoeDispatcher::allgather) out << "-agd";
  }
  return out.str();
}

namespace {

// Pruned with megatron_arguments' reasons (its notes that say why Megatron-LM cannot run it).
void prune_unless_megatron_runnable(Candidate& c, const ModelConfig& model) {
  MegatronArguments megatron = megatron_arguments(c.plan, model);
  if (megatron.runnable) return;
  c.pruned = "Megatron-LM cannot run it as simulated";
  for (const auto& n : megatron.notes) {
    if (n.rfind("Megatron-LM cannot run", 0) != 0) continue;
    c.pruned_detail += (c.pruned_detail.empty() ? "" : "; ") + n;
  }
}

// The expert layouts tried on a stage of `stage_ranks` ranks with tensor parallelism `tp`: every
// (ep, etp, dispatcher) of the space; one default layout for a dense model. Combinations that
// do not divide are left to validate_plan, which prunes them with its reason.
std::vector<MoePlan> expert_layouts(const ModelConfig& model, const SearchSpace& space, int64_t tp,
                                    int64_t stage_ranks) {
  if (!model.is_moe()) return {MoePlan{}};
  std::vector<int64_t> etps = space.expert_tensor_parallel_sizes;
  if (etps.empty()) etps = tp == 1 ? std::vector<int64_t>{1} : std::vector<int64_t>{1, tp};
  std::vector<MoePlan> out;
  for (int64_t etp : etps) {
    std::vector<int64_t> eps = space.expert_parallel_sizes;
    if (eps.empty()) {
      for (int64_t ep : divisors(model.num_experts)) {
        if (stage_ranks % (ep * etp) == 0) eps.push_back(ep);
      }
      if (eps.empty()) eps.push_back(1);  // (etp does not divide the stage: validate says so)
    }
    for (int64_t ep : eps) {
      for (MoeDispatcher dispatcher : space.moe_dispatchers) {
        // ep 1 without etp dispatches nothing: one dispatcher stands for both.
        if (ep * etp == 1 && dispatcher != space.moe_dispatchers.front()) continue;
        MoePlan moe = space.moe;
        if (moe.top_k == 0) moe.top_k = model.num_experts_per_tok;  // (resolved here for the name)
        moe.ep_size = ep;
        moe.etp_size = etp;
        moe.dispatcher = dispatcher;
        moe.set = true;
        out.push_back(moe);
      }
    }
  }
  return out;
}

}  // namespace

std::vector<Candidate> enumerate_candidates(const ModelConfig& model, const Topology& topology,
                                            const SearchSpace& space) {
  const int64_t devices = topology.num_devices();
  const Dtype dtype = search_dtype(topology);
  std::vector<int64_t> cps = space.context_parallel_sizes;
  if (cps.empty()) {  // powers of two that leave every cp rank at least 8,192 tokens
    cps = {1};
    if (space.attention_impl == AttentionImpl::flash) {
      for (int64_t cp = 2; cp <= 32 && model.seq_length / cp >= 8192; cp *= 2) cps.push_back(cp);
    }
  }
  std::vector<Candidate> out;
  for (int64_t tp : divisors(topology.node.devices_per_node)) {
    if (devices % tp != 0) continue;
    for (int64_t cp : cps) {
    if ((devices / tp) % cp != 0) continue;
    for (int64_t pp : divisors(devices / (tp * cp))) {
      int64_t dp = devices / (tp * cp * pp);
      std::vector<std::pair<ScheduleKind, int64_t>> schedules{{ScheduleKind::one_f_one_b, 1}};
      if (pp > 1) {
        for (int64_t v : space.virtual_pp_sizes) schedules.push_back({ScheduleKind::interleaved_1f1b, v});
        if (space.include_gpipe) schedules.push_back({ScheduleKind::gpipe, 1});
      }
      // Shards kept inside a node: dp_shard_size = the dp ranks a node holds.
      const int64_t node_shard = topology.node.devices_per_node / tp;
      std::vector<int64_t> instance_counts{1};
      if (space.hybrid_sharding && node_shard >= 2 && dp > node_shard && dp % node_shard == 0) {
        instance_counts.push_back(dp / node_shard);
      }
      const std::vector<MoePlan> layouts = expert_layouts(model, space, tp, tp * cp * dp);
      for (int64_t mbs : space.micro_batch_sizes) {
        for (int zero : space.zero_stages) {
         for (int64_t instances : instance_counts) {
          if (zero == 0 && instances > 1) continue;
          for (auto [schedule, vpp] : schedules) {
            for (RecomputeKind recompute :
                 {RecomputeKind::none, RecomputeKind::selective, RecomputeKind::full}) {
              // Flash attention keeps no scores: selective recompute lowers to none's program.
              if (recompute == RecomputeKind::selective && space.attention_impl == AttentionImpl::flash) continue;
              for (bool sp : {false, true}) {
               if (sp && tp == 1) continue;
               for (CpCommType comm : space.cp_comm_types) {
                if (comm != space.cp_comm_types.front() && cp == 1) continue;  // (no exchange to choose)
                for (const MoePlan& moe : layouts) {
                Candidate c;
                Plan& p = c.plan;
                p.tp_size = tp;
                p.cp_size = cp;
                p.cp_comm_type = comm;
                p.pp_size = pp;
                p.dp_size = dp;
                p.zero_stage = zero;
                p.num_distributed_optimizer_instances = instances;
                p.micro_batch_size = mbs;
                p.global_batch_size = space.global_batch_size;
                p.schedule = schedule;
                p.virtual_pp_size = vpp;
                p.recompute = recompute;
                p.sequence_parallel = sp;
                p.param_dtype = dtype;
                p.grad_dtype = Dtype::fp32;
                p.overlap_grad_reduce = dp * cp > 1;
                p.overlap_param_gather = zero >= 1 && dp * cp > 1;
                p.overlap_p2p_comm = default_overlap_p2p_comm(schedule);
                p.attention_impl = space.attention_impl;
                p.fp8 = space.fp8;
                // (--fp8-param-gather: the candidates with sharded optimizer state, as Megatron-LM's flag)
                p.fp8.param_gather = space.fp8.param_gather && zero >= 1;
                p.dropout = space.dropout;
                p.moe = moe;
                p.name = plan_name(p);
                p.file = "candidate " + p.name;
                try {
                  validate_plan(p, model, topology);
                } catch (const InputError& e) {
                  c.pruned = reason_category(e.what(), model.file, topology.file);
                  c.pruned_detail = e.what();
                }
                if (c.kept() && space.megatron_runnable_only) prune_unless_megatron_runnable(c, model);
                out.push_back(std::move(c));
                }
               }
              }
            }
          }
         }
        }
      }
    }
    }
  }
  return out;
}

Plan memory_path_plan(const Plan& plan) {
  Plan p = plan;
  // A mixture of experts' dropless buffers: sized by the whole step's routing draws.
  if (p.moe.draw_microbatches == 0) p.moe.draw_microbatches = plan.num_microbatches();
  if (plan.unequal_microbatches()) {  // memory: every replica as the busiest one
    p.microbatches_per_replica.clear();
    p.global_batch_size = plan.num_microbatches() * plan.micro_batch_size * plan.dp_size;
  }
  if (plan.schedule == ScheduleKind::gpipe) return p;
  int64_t cap = 2 * plan.pp_size;
  if (plan.num_microbatches() > cap) {
    p.global_batch_size = cap * plan.micro_batch_size * plan.dp_size;
  }
  return p;
}

namespace {

// Memory's peak of one stage (runtime allowance included), from that stage's role alone:
// lowered with memory_path_plan's microbatches, or the whole step's where lowering keeps send
// staging copies to the step's end (the peak then grows with the microbatches).
double walk_stage(const ModelConfig& model, const Topology& topology, const Plan& plan,
                  int64_t stage, bool whole_step) {
  Role role = lower_role(model, topology, whole_step ? plan : memory_path_plan(plan), stage, RoleDetail::memory_walk);
  return walk_role_memory(role).peak_bytes + topology.node.device.runtime_allowance_bytes;
}

}  // namespace

void prune_for_memory(Candidate& c, double peak, double allowed, const std::string& what) {
  c.pruned = "does not fit in memory";
  c.peak_is_lower_bound = true;
  c.peak_bytes_max = peak;
  c.peak_lower_bytes = std::max(c.peak_lower_bytes, peak);
  c.pruned_detail = what + " " + gib(peak) + " + reserved " + gib(c.reserved_bytes) + " > " +
                    gib(allowed) + " allowed";
}

void check_candidate_memory(Candidate& c, const ModelConfig& model, const Topology& topology,
                            const SearchSpace& space, ProbeCache& probes) {
  if (!c.kept()) return;
  if (model.is_moe()) return check_moe_candidate(c, model, topology, space, nullptr);
  const Plan& plan = c.plan;
  const DeviceSpec& device = topology.node.device;
  c.memory_checked = true;
  c.reserved_bytes = device.memory_reserved_bytes;
  c.capacity_bytes = device.memory_bytes;
  const double allowed = space.max_memory_fraction * device.memory_bytes;
  const double limit = allowed - device.memory_reserved_bytes;  // on the peak
  const LayerProbe& probe = probes.get(plan);
  c.whole_step_walk = probe.send_staging;
  c.stage_bounds = stage_memory_bounds(plan, model, topology, probe);
  c.peak_lower_bytes = 0;
  c.peak_upper_bytes = 0;
  for (const auto& b : c.stage_bounds) {
    c.peak_lower_bytes = std::max(c.peak_lower_bytes, b.lower_bytes);
    c.peak_upper_bytes = std::max(c.peak_upper_bytes, b.upper_bytes);
  }
  if (c.peak_lower_bytes > limit) {
    prune_for_memory(c, c.peak_lower_bytes, allowed,
                 "weights, gradients, optimizer state and the activations kept by the layers "
                 "in flight need at least");
    return;
  }
  if (c.peak_upper_bytes > limit) {
    // The limit lies between the bounds: walk the stages that could exceed it, most likely first.
    std::vector<StageMemoryBounds*> open;
    for (auto& b : c.stage_bounds) {
      if (b.upper_bytes > limit) open.push_back(&b);
    }
    std::sort(open.begin(), open.end(), [](auto* a, auto* b) { return a->lower_bytes > b->lower_bytes; });
    for (StageMemoryBounds* b : open) {
      double peak = walk_stage(model, topology, plan, b->stage, probe.send_staging);
      ++c.walked_stages;
      b->lower_bytes = b->upper_bytes = peak;
      if (peak > limit) {
        prune_for_memory(c, peak, allowed, "stage " + std::to_string(b->stage) + " peaks at");
        return;
      }
    }
    c.peak_lower_bytes = c.peak_upper_bytes = 0;
    for (const auto& b : c.stage_bounds) {
      c.peak_lower_bytes = std::max(c.peak_lower_bytes, b.lower_bytes);
      c.peak_upper_bytes = std::max(c.peak_upper_bytes, b.upper_bytes);
    }
  }
  c.peak_bytes_max = c.peak_upper_bytes;
  c.peak_exact = c.peak_lower_bytes == c.peak_upper_bytes;
}

void check_candidate(Candidate& c, const ModelConfig& model, const Topology& topology,
                     const SearchSpace& space, const ComputeCostModel& cost_model,
                     ProbeCache& probes) {
  if (model.is_moe()) return check_moe_candidate(c, model, topology, space, &cost_model);
  check_candidate_memory(c, model, topology, space, probes);
  if (c.kept()) c.estimate = probe_estimate(c.plan, model, topology, probes.get(c.plan), cost_model);
}

void resolve_peak(Candidate& c, const ModelConfig& model, const Topology& topology) {
  if (c.peak_exact || c.stage_bounds.empty()) return;
  double lower = 0;
  for (const auto& b : c.stage_bounds) lower = std::max(lower, b.lower_bytes);
  double peak = 0;
  for (auto& b : c.stage_bounds) {
    // A stage whose upper bound is below another's lower bound cannot hold the peak.
    if (b.upper_bytes < lower) continue;
    if (b.lower_bytes != b.upper_bytes) {
      b.lower_bytes = b.upper_bytes = walk_stage(model, topology, c.plan, b.stage, c.whole_step_walk);
      ++c.walked_stages;
    }
    peak = std::max(peak, b.upper_bytes);
  }
  c.peak_bytes_max = c.peak_lower_bytes = c.peak_upper_bytes = peak;
  c.peak_exact = true;
}

void resolve_smallest_peaks(std::vector<Candidate>& candidates, int64_t count,
                            const ModelConfig& model, const Topology& topology, int jobs) {
  std::vector<double> uppers;
  for (const auto& c : candidates) {
    if (c.kept()) uppers.push_back(c.peak_upper_bytes);
  }
  if (uppers.empty() || count < 1) return;
  size_t k = size_t(std::min<int64_t>(count, int64_t(uppers.size()))) - 1;
  std::nth_element(uppers.begin(), uppers.begin() + k, uppers.end());
  double cut = uppers[k];
  std::vector<Candidate*> open;
  for (auto& c : candidates) {
    if (c.kept() && !c.peak_exact && c.peak_lower_bytes <= cut) open.push_back(&c);
  }
  parallel_for(
      int64_t(open.size()), jobs,
      [&](int64_t i) { resolve_peak(*open[size_t(i)], model, topology); }, nullptr);
}

void check_candidates(std::vector<Candidate>& candidates, const ModelConfig& model,
                      const Topology& topology, const SearchSpace& space,
                      const ComputeCostModel& cost_model, int jobs, const Progress& progress) {
  std::vector<Candidate*> kept;
  for (auto& c : candidates) {
    if (c.kept()) kept.push_back(&c);
  }
  if (model.is_moe()) return check_moe_candidates(kept, model, topology, space, cost_model, jobs, progress);
  ProbeCache probes(model, topology);
  // Memory on `jobs` threads; the estimates after, on one (the cost model caches the rates it
  // interpolates).
  parallel_for(
      int64_t(kept.size()), jobs,
      [&](int64_t i) { check_candidate_memory(*kept[size_t(i)], model, topology, space, probes); },
      progress);
  for (Candidate* c : kept) {
    if (c->kept()) c->estimate = probe_estimate(c->plan, model, topology, probes.get(c->plan), cost_model);
  }
}

std::vector<Candidate> search(std::vector<Candidate> candidates, const Evaluator& evaluate,
                              int64_t evaluate_count, int jobs, const Progress& progress,
                              Objective objective, int64_t evaluate_stride) {
  std::vector<Candidate> kept;
  for (auto& c : candidates) {
    if (c.kept()) kept.push_back(std::move(c));
  }
  // Ties broken by name so the order is deterministic.
  auto by_estimate = [](const Candidate& a, const Candidate& b) {
    if (a.estimate.step_time_s != b.estimate.step_time_s) return a.estimate.step_time_s < b.estimate.step_time_s;
    return a.plan.name < b.plan.name;
  };
  std::sort(kept.begin(), kept.end(), by_estimate);
  if (objective == Objective::memory) {
    auto key = [](const Candidate& c) { return c.peak_exact ? c.peak_bytes_max : c.peak_lower_bytes; };
    std::stable_sort(kept.begin(), kept.end(), [&](const Candidate& a, const Candidate& b) {
      return key(a) < key(b);
    });
  } else if (objective == Objective::energy) {
    std::stable_sort(kept.begin(), kept.end(), [](const Candidate& a, const Candidate& b) {
      return a.estimate_energy_j < b.estimate_energy_j;
    });
  }
  std::vector<size_t> chosen;
  for (size_t i = 0; i < kept.size(); ++i) {
    int64_t k = int64_t(i);
    if (k < evaluate_count || (evaluate_stride > 0 && (k - evaluate_count) % evaluate_stride == 0)) {
      chosen.push_back(i);
    }
  }
  parallel_for(
      int64_t(chosen.size()), jobs,
      [&](int64_t i) {
        Candidate& c = kept[chosen[size_t(i)]];
        try {
          c.step_time_s = evaluate(c.plan);
        } catch (const std::exception& e) {
          c.evaluation_error = e.what();
        }
      },
      progress);
  if (objective != Objective::time) return kept;
  std::stable_sort(kept.begin(), kept.end(), [](const Candidate& a, const Candidate& b) {
    if (a.step_time_s.has_value() != b.step_time_s.has_value()) return a.step_time_s.has_value();
    if (a.step_time_s && *a.step_time_s != *b.step_time_s) return *a.step_time_s < *b.step_time_s;
    return false;  // keeps the estimate order
  });
  return kept;
}

double estimate_energy_j(const QuickEstimate& estimate, int64_t devices, double power_idle_w, double power_busy_w) {
  const double busy_s = std::min(estimate.step_time_s, estimate.compute_s + estimate.optimizer_s);
  const DeviceTime every_device{0, devices, busy_s, 0, estimate.step_time_s - busy_s};
  return step_energy({every_device}, power_idle_w, power_busy_w).energy_per_step_j;
}

void rank_by_energy(std::vector<Candidate>& ranked) {
  std::stable_sort(ranked.begin(), ranked.end(), [](const Candidate& a, const Candidate& b) {
    if (a.energy_per_step_j.has_value() != b.energy_per_step_j.has_value()) return a.energy_per_step_j.has_value();
    if (a.energy_per_step_j && *a.energy_per_step_j != *b.energy_per_step_j) {
      return *a.energy_per_step_j < *b.energy_per_step_j;
    }
    return false;  // keeps the estimate order
  });
}

double spearman_rank_correlation(const std::vector<double>& x, const std::vector<double>& y) {
  size_t n = x.size();
  if (n < 2 || y.size() != n) return std::nan("");
  auto ranks = [n](const std::vector<double>& v) {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
    std::vector<double> r(n);
    for (size_t i = 0; i < n;) {
      size_t j = i;
      while (j + 1 < n && v[order[j + 1]] == v[order[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[order[k]] = 0.5 * double(i + j) + 1;
      i = j + 1;
    }
    return r;
  };
  std::vector<double> rx = ranks(x), ry = ranks(y);
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) mx += rx[i], my += ry[i];
  mx /= double(n);
  my /= double(n);
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxy += (rx[i] - mx) * (ry[i] - my);
    sxx += (rx[i] - mx) * (rx[i] - mx);
    syy += (ry[i] - my) * (ry[i] - my);
  }
  if (sxx == 0 || syy == 0) return std::nan("");
  return sxy / std::sqrt(sxx * syy);
}

double amdahl_serial_fraction(const std::vector<std::pair<double, double>>& xy) {
  double num = 0, den = 0;
  for (auto [x, y] : xy) {
    num += (1 - x) * (y - x);
    den += (1 - x) * (1 - x);
  }
  return den > 0 ? num / den : std::nan("");
}

std::map<std::string, int64_t> pruned_counts(const std::vector<Candidate>& candidates) {
  std::map<std::string, int64_t> counts;
  for (const auto& c : candidates) {
    if (!c.kept()) ++counts[c.pruned];
  }
  return counts;
}

std::vector<FitSuggestion> suggest_fits(const Plan& plan, const ModelConfig& model,
                                        const Topology& topology, const SearchSpace& space) {
  struct Variant {
    std::string change;
    Plan plan;
    Topology topology;
  };
  std::vector<Variant> variants;
  auto add = [&](const std::string& change, auto edit) {
    Variant v{change, plan, topology};
    v.plan.layers_per_stage.clear();
    v.plan.grad_bucket_bytes = 0;
    edit(v);
    v.plan.overlap_param_gather = v.plan.zero_stage >= 1 && v.plan.dp_size > 1;
    v.plan.overlap_grad_reduce = v.plan.dp_size > 1;
    v.plan.overlap_p2p_comm = default_overlap_p2p_comm(v.plan.schedule);
    v.plan.name = plan_name(v.plan);
    variants.push_back(std::move(v));
  };
  add("zero_stage 3", [](Variant& v) { v.plan.zero_stage = 3; });
  add("full recompute", [](Variant& v) { v.plan.recompute = RecomputeKind::full; });
  add("micro_batch_size 1", [](Variant& v) { v.plan.micro_batch_size = 1; });
  add("flash attention", [](Variant& v) { v.plan.attention_impl = AttentionImpl::flash; });
  add("zero_stage 3 + full recompute + micro_batch_size 1", [](Variant& v) {
    v.plan.zero_stage = 3;
    v.plan.recompute = RecomputeKind::full;
    v.plan.micro_batch_size = 1;
  });
  add("twice the nodes (--nodes " + std::to_string(topology.num_nodes * 2) + ", dp_size " +
          std::to_string(plan.dp_size * 2) + ")",
      [](Variant& v) {
        v.topology.num_nodes *= 2;
        v.plan.dp_size *= 2;
      });
  std::vector<FitSuggestion> out;
  for (auto& v : variants) {
    FitSuggestion s;
    s.change = v.change;
    try {
      validate_plan(v.plan, model, v.topology);
      Candidate c;
      c.plan = v.plan;
      ComputeCostModel unused(v.topology.node.device, v.plan.param_dtype,
                              roofline_profile(v.topology), v.topology.file);
      if (v.plan.fp8.enabled()) unused.use_fp8(v.topology.node.device, v.topology.file);
      ProbeCache probes(model, v.topology);
      check_candidate(c, model, v.topology, space, unused, probes);
      s.fits = c.kept();
      if (s.fits) resolve_peak(c, model, v.topology);
      s.peak_bytes_max = c.peak_bytes_max;
      if (!c.kept()) s.note = c.pruned_detail;
    } catch (const InputError& e) {
      s.note = e.what();
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace stepcast
