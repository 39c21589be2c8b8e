// Device profiles as files: strict loading (every key checked, points sorted and unique, sources
// named) and writing back (profile_to_json(parse_profile(j)) keeps what j says).
#include <cmath>
#include <set>
#include <sstream>
#include <tuple>

#include "collective.hpp"
#include "errors.hpp"
#include "cost_model.hpp"
#include "profile.hpp"

namespace stepcast {

namespace {

const std::vector<std::string> kGemmVariants = {"forward", "dgrad", "wgrad"};
const std::vector<std::string> kCollectiveKinds = {"all_reduce", "reduce_scatter", "all_gather",
                                                   "all_to_all"};
const std::vector<std::string> kCollectiveAlgorithms = {"ring", "tree", "mpi", "nccl"};
const std::vector<std::string> kAttentionPasses = {"forward", "backward", "forward_backward"};
const std::vector<std::string> kTableDtypes = {"fp64", "fp32", "tf32", "bf16", "fp16", "fp8"};

// The array at `key` of `parent`, each element handed to `read_one` with an ObjectReader
// prefixed "KEY[i].".
template <class F>
void read_points(ObjectReader& reader, const Json& parent, const std::string& key, F read_one) {
  reader.accept(key);
  if (!parent.contains(key)) return;
  const Json& list = parent.at(key);
  if (!list.is_array()) reader.fail(key, "must be a JSON array", "[{...}, ...]");
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_object()) reader.fail(key, "element " + std::to_string(i) + " is not an object", "{...}");
    ObjectReader point(list[i], reader.file(), reader.key_path(key) + "[" + std::to_string(i) + "].");
    read_one(point, i);
    point.finish();
  }
}

// Points of one table must come in increasing order of their size, each size once: `Order`
// keeps the last size seen per table.
template <class Key, class Size>
class Order {
 public:
  Order(const ObjectReader& reader, std::string key, std::string size_name)
      : reader_(reader), key_(std::move(key)), size_name_(std::move(size_name)) {}
  void check(size_t index, const Key& table, const Size& size) {
    auto it = last_.find(table);
    if (it != last_.end() && !(it->second < size)) {
      reader_.fail(key_ + "[" + std::to_string(index) + "]",
                   it->second == size ? "duplicates an earlier point of its table"
                                      : "is out of order in its table",
                   "each table's points once, in increasing " + size_name_);
    }
    last_[table] = size;
  }

 private:
  const ObjectReader& reader_;
  std::string key_, size_name_;
  std::map<Key, Size> last_;
};

std::optional<double> optional_number(ObjectReader& reader, const std::string& key, bool exclusive) {
  if (!reader.has(key)) {
    reader.accept(key);
    return std::nullopt;
  }
  return reader.get_number(key, 0, exclusive);
}

// A point's time: `time_s`, or derived from a rate key (`rate_key` = work / time). With both,
// they must agree to 0.1%. Neither: refused, naming the keys.
double point_time(ObjectReader& p, const std::string& rate_key, double work) {
  std::optional<double> time = optional_number(p, "time_s", true);
  std::optional<double> rate = optional_number(p, rate_key, true);
  if (!time && !rate) {
    p.fail("time_s", "missing: the point has neither time_s nor " + rate_key,
           "time_s in seconds (or " + rate_key + ")");
  }
  if (time && rate && std::abs(work / *time - *rate) > 1e-3 * *rate) {
    std::ostringstream why;
    why.precision(6);
    why << "disagrees with " << rate_key << " = " << *rate << " (work / time_s = " << work / *time << ")";
    p.fail("time_s", why.str(), "one of the two, or both consistent");
  }
  return time ? *time : work / *rate;
}

std::string read_source(ObjectReader& p, const std::map<std::string, std::string>& sources) {
  std::string source = p.get_string_or("source", "");
  if (!source.empty() && !sources.count(source)) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : sources) keys.push_back(k);
    p.fail("source", "names no entry of the profile's \"sources\"",
           keys.empty() ? "a key of \"sources\" (the profile has none)" : "one of: " + [&] {
             std::string list;
             for (const auto& k : keys) list += (list.empty() ? "" : ", ") + k;
             return list;
           }());
  }
  return source;
}

// A section's `notes` (a string), kept to be written back.
void read_notes(ObjectReader& section, const std::string& where, DeviceProfile& p) {
  std::string notes = section.get_string_or("notes", "");
  if (!notes.empty()) p.section_notes[where] = notes;
}

MeasuredTables parse_measured(ObjectReader& reader, const Json& json,
                              const std::map<std::string, std::string>& sources) {
  MeasuredTables t;
  t.dtype = *parse_dtype(reader.get_enum("dtype", kTableDtypes));
  t.gemm_use = reader.get_enum_or("gemm_use", {"table", "fit"}, "table");
  if (reader.has("method")) t.method = json.at("method");
  if (reader.has("fits")) t.fits = json.at("fits");
  reader.accept("method");
  reader.accept("fits");
  auto read_gemm = [&](ObjectReader& p, bool reuse) {
    GemmPoint g;
    g.variant = p.get_enum("variant", kGemmVariants);
    g.m = p.get_int("m", 1);
    g.n = p.get_int("n", 1);
    g.k = p.get_int("k", 1);
    g.count = p.get_int_or("count", 1, 1);
    g.time_s = point_time(p, "flops_per_s", g.flops());
    g.source = read_source(p, sources);
    if (reuse) g.reuse_distance_bytes = p.get_number("reuse_distance_bytes", 0, false);
    return g;
  };
  Order<std::tuple<std::string, int64_t>, std::tuple<int64_t, int64_t, int64_t>> gemm_order(
      reader, "gemm_points", "(m, n, k)");
  read_points(reader, json, "gemm_points", [&](ObjectReader& p, size_t i) {
    GemmPoint g = read_gemm(p, false);
    gemm_order.check(i, {g.variant, g.count}, {g.m, g.n, g.k});
    t.gemm.push_back(g);
  });
  Order<std::tuple<double, std::string>, std::tuple<int64_t, int64_t, int64_t>> gemm_reuse_order(
      reader, "gemm_reuse_points", "(m, n, k)");
  read_points(reader, json, "gemm_reuse_points", [&](ObjectReader& p, size_t i) {
    GemmPoint g = read_gemm(p, true);
    gemm_reuse_order.check(i, {g.reuse_distance_bytes, g.variant}, {g.m, g.n, g.k});
    t.gemm_reuse.push_back(g);
  });
  Order<std::string, double> memory_order(reader, "memory_points", "bytes");
  read_points(reader, json, "memory_points", [&](ObjectReader& p, size_t i) {
    MemoryPoint m;
    m.family = p.get_enum("family", memory_families());
    m.bytes = p.get_number("bytes", 0, true);
    m.time_s = point_time(p, "bandwidth_bytes_per_s", m.bytes);
    m.source = read_source(p, sources);
    memory_order.check(i, m.family, m.bytes);
    t.memory.push_back(m);
  });
  auto read_collective = [&](ObjectReader& p, bool reuse) {
    CollectivePoint c;
    c.kind = p.get_enum("kind", kCollectiveKinds);
    c.algorithm = p.get_enum("algorithm", kCollectiveAlgorithms);
    c.group_size = p.get_int("group_size", 2);
    c.nodes = p.get_int_or("nodes", 1, 1);
    if (c.group_size % c.nodes != 0) {
      p.fail("nodes", "does not divide group_size " + std::to_string(c.group_size),
             "the nodes the group spans, each with group_size / nodes members");
    }
    c.bytes = p.get_number("bytes", 0, true);
    c.time_s = point_time(p, "algbw_bytes_per_s", c.bytes);
    c.algbw_bytes_per_s = c.bytes / c.time_s;
    c.busbw_bytes_per_s = c.algbw_bytes_per_s * bus_bandwidth_factor(*collective_kind(c.kind), c.group_size);
    std::optional<double> busbw = optional_number(p, "busbw_bytes_per_s", true);
    if (busbw && std::abs(*busbw - c.busbw_bytes_per_s) > 2e-3 * c.busbw_bytes_per_s) {
      std::ostringstream why;
      why.precision(6);
      why << "disagrees with bytes / time_s · the bus factor of " << c.kind << " on "
          << c.group_size << " ranks (" << c.busbw_bytes_per_s << ")";
      p.fail("busbw_bytes_per_s", why.str(), "nccl-tests' busbw, or no busbw");
    }
    c.source = read_source(p, sources);
    if (reuse) c.reuse_distance_bytes = p.get_number("reuse_distance_bytes", 0, true);
    return c;
  };
  Order<std::tuple<std::string, std::string, int64_t, int64_t>, double> collective_order(
      reader, "collective_points", "bytes");
  read_points(reader, json, "collective_points", [&](ObjectReader& p, size_t i) {
    CollectivePoint c = read_collective(p, false);
    collective_order.check(i, {c.kind, c.algorithm, c.group_size, c.nodes}, c.bytes);
    t.collectives.push_back(c);
  });
  Order<std::tuple<std::string, std::string, int64_t, int64_t, double>, double> reuse_order(
      reader, "collective_reuse_points", "bytes");
  read_points(reader, json, "collective_reuse_points", [&](ObjectReader& p, size_t i) {
    CollectivePoint c = read_collective(p, true);
    reuse_order.check(i, {c.kind, c.algorithm, c.group_size, c.nodes, c.reuse_distance_bytes}, c.bytes);
    t.collective_reuse.push_back(c);
  });
  Order<int, double> p2p_order(reader, "p2p_points", "bytes");
  read_points(reader, json, "p2p_points", [&](ObjectReader& p, size_t i) {
    P2pPoint q;
    q.bytes = p.get_number("bytes", 0, true);
    q.time_s = point_time(p, "bandwidth_bytes_per_s", q.bytes);
    q.source = read_source(p, sources);
    p2p_order.check(i, 0, q.bytes);
    t.p2p.push_back(q);
  });
  Order<int, double> inter_order(reader, "p2p_inter_node_points", "bytes");
  read_points(reader, json, "p2p_inter_node_points", [&](ObjectReader& p, size_t i) {
    P2pPoint q;
    q.bytes = p.get_number("bytes", 0, true);
    q.time_s = point_time(p, "bandwidth_bytes_per_s", q.bytes);
    q.source = read_source(p, sources);
    inter_order.check(i, 0, q.bytes);
    t.p2p_inter_node.push_back(q);
  });
  Order<std::tuple<std::string, std::string, int64_t, bool>, int64_t> attention_order(
      reader, "attention_points", "seq");
  read_points(reader, json, "attention_points", [&](ObjectReader& p, size_t i) {
    AttentionPoint a;
    a.impl = p.get_enum_or("impl", {"flash", "materialized", "cp_flash"}, "flash");
    a.pass = p.get_enum("pass", kAttentionPasses);
    a.seq = p.get_int("seq", 1);
    a.head_dim = p.get_int("head_dim", 1);
    if (a.impl == "materialized") {
      if (a.pass != "forward_backward") {
        p.fail("pass", "'" + a.pass + "' for a materialized point",
               "forward_backward (a materialized point corrects the forward and backward ops together)");
      }
      a.batch = p.get_int("batch", 1);
      a.heads = p.get_int("heads", 1);
    }
    a.causal = p.get_bool_or("causal", true);
    a.flops_per_s = p.get_number("flops_per_s", 0, true);
    a.source = read_source(p, sources);
    attention_order.check(i, {a.impl, a.pass, a.head_dim, a.causal}, a.seq);
    t.attention.push_back(a);
  });
  if (reader.has("system")) {
    ObjectReader y = reader.get_object("system");
    MeasuredSystem m;
    m.devices_per_node = y.get_int("devices_per_node", 1);
    m.intra_node_bandwidth_bytes_per_s = y.get_number("intra_node_bandwidth_bytes_per_s", 0, true);
    m.intra_node_latency_s = y.get_number("intra_node_latency_s", 0, false);
    m.nics_per_node = y.get_int("nics_per_node", 1);
    m.nic_bandwidth_bytes_per_s = y.get_number("nic_bandwidth_bytes_per_s", 0, true);
    m.nic_latency_s = y.get_number("nic_latency_s", 0, false);
    m.switch_latency_s = y.get_number("switch_latency_s", 0, false);
    m.oversubscription = y.get_number_or("oversubscription", 1, false, 1);
    if (m.oversubscription < 1) y.fail("oversubscription", "is below 1", "a ratio >= 1 (1: non-blocking)");
    m.notes = y.get_string_or("notes", "");
    y.finish();
    t.system = m;
  } else {
    reader.accept("system");
  }
  t.gemm_table_pool_bytes = reader.get_number_or("gemm_table_pool_bytes", 0, false, 0);
  reader.finish();
  if (!t.gemm_reuse.empty() && !(t.gemm_table_pool_bytes > 0)) {
    reader.fail("gemm_table_pool_bytes", "is missing beside gemm_reuse_points",
                "the bytes of each operand array the gemm_points' calls rotated through (> 0)");
  }
  if (t.gemm_use == "fit" && t.gemm.empty()) {
    reader.fail("gemm_use", "is \"fit\" but there are no gemm_points", "\"table\", or GEMM points");
  }
  return t;
}

void put_source(Json& point, const std::string& source) {
  if (!source.empty()) point["source"] = source;
}

Json measured_to_json(const MeasuredTables& t) {
  Json gemm = Json::array(), memory = Json::array(), collectives = Json::array(), p2p = Json::array(),
       attention = Json::array();
  Json gemm_reuse = Json::array();
  for (const auto* list : {&t.gemm, &t.gemm_reuse}) {
    for (const GemmPoint& g : *list) {
      Json j = {{"variant", g.variant}, {"m", g.m}, {"n", g.n}, {"k", g.k}, {"time_s", g.time_s},
                {"flops_per_s", g.flops() / g.time_s}};
      if (g.count != 1) j["count"] = g.count;
      if (list == &t.gemm_reuse) j["reuse_distance_bytes"] = g.reuse_distance_bytes;
      put_source(j, g.source);
      (list == &t.gemm ? gemm : gemm_reuse).push_back(j);
    }
  }
  for (const MemoryPoint& m : t.memory) {
    Json j = {{"family", m.family}, {"bytes", m.bytes}, {"time_s", m.time_s},
              {"bandwidth_bytes_per_s", m.bytes / m.time_s}};
    put_source(j, m.source);
    memory.push_back(j);
  }
  Json reuse = Json::array();
  for (const auto* list : {&t.collectives, &t.collective_reuse}) {
    for (const CollectivePoint& c : *list) {
      Json j = {{"kind", c.kind}, {"algorithm", c.algorithm}, {"group_size", c.group_size},
                {"bytes", c.bytes}, {"time_s", c.time_s}, {"algbw_bytes_per_s", c.algbw_bytes_per_s},
                {"busbw_bytes_per_s", c.busbw_bytes_per_s}};
      if (c.nodes != 1) j["nodes"] = c.nodes;
      if (list == &t.collective_reuse) j["reuse_distance_bytes"] = c.reuse_distance_bytes;
      put_source(j, c.source);
      (list == &t.collectives ? collectives : reuse).push_back(j);
    }
  }
  for (const P2pPoint& q : t.p2p) {
    Json j = {{"bytes", q.bytes}, {"time_s", q.time_s}, {"bandwidth_bytes_per_s", q.bytes / q.time_s}};
    put_source(j, q.source);
    p2p.push_back(j);
  }
  Json p2p_inter = Json::array();
  for (const P2pPoint& q : t.p2p_inter_node) {
    Json j = {{"bytes", q.bytes}, {"time_s", q.time_s}, {"bandwidth_bytes_per_s", q.bytes / q.time_s}};
    put_source(j, q.source);
    p2p_inter.push_back(j);
  }
  for (const AttentionPoint& a : t.attention) {
    Json j = {{"pass", a.pass}, {"seq", a.seq}, {"head_dim", a.head_dim}, {"causal", a.causal},
              {"flops_per_s", a.flops_per_s}};
    if (a.impl != "flash") j["impl"] = a.impl;
    if (a.impl == "materialized") {
      j["batch"] = a.batch;
      j["heads"] = a.heads;
    }
    put_source(j, a.source);
    attention.push_back(j);
  }
  Json out = {{"dtype", to_string(t.dtype)}, {"method", t.method},         {"fits", t.fits},
              {"gemm_points", gemm},         {"memory_points", memory},    {"collective_points", collectives},
              {"p2p_points", p2p}};
  if (!p2p_inter.empty()) out["p2p_inter_node_points"] = p2p_inter;
  if (!reuse.empty()) out["collective_reuse_points"] = reuse;
  if (!gemm_reuse.empty()) out["gemm_reuse_points"] = gemm_reuse;
  if (t.gemm_table_pool_bytes > 0) out["gemm_table_pool_bytes"] = t.gemm_table_pool_bytes;
  if (t.gemm_use != "table") out["gemm_use"] = t.gemm_use;
  if (t.system) {
    const MeasuredSystem& m = *t.system;
    out["system"] = {{"devices_per_node", m.devices_per_node},
                     {"intra_node_bandwidth_bytes_per_s", m.intra_node_bandwidth_bytes_per_s},
                     {"intra_node_latency_s", m.intra_node_latency_s},
                     {"nics_per_node", m.nics_per_node},
                     {"nic_bandwidth_bytes_per_s", m.nic_bandwidth_bytes_per_s},
                     {"nic_latency_s", m.nic_latency_s},
                     {"switch_latency_s", m.switch_latency_s},
                     {"oversubscription", m.oversubscription}};
    if (!m.notes.empty()) out["system"]["notes"] = m.notes;
  }
  if (!t.attention.empty()) out["attention_points"] = attention;
  return out;
}

}  // namespace

DeviceProfile parse_profile(const Json& json, const std::string& file) {
  ObjectReader reader(json, file);
  DeviceProfile p;
  p.file = file;
  p.name = reader.get_string("name");
  p.notes = reader.get_string_or("notes", "");
  p.device = reader.get_string("device");
  p.backend = reader.get_enum("backend", {"datasheet", "cpu", "cuda"});
  p.is_roofline = reader.get_bool_or("roofline", false);
  if (reader.has("sources")) {
    reader.accept("sources");
    const Json& sources = json.at("sources");
    if (!sources.is_object()) reader.fail("sources", "must be a JSON object", "{\"KEY\": \"citation\"}");
    for (const auto& [key, citation] : sources.items()) {
      if (!citation.is_string() || citation.get<std::string>().empty()) {
        reader.fail("sources." + key, "must be a non-empty string", "the citation: where the figures come from");
      }
      p.sources[key] = citation.get<std::string>();
    }
  } else {
    reader.accept("sources");
  }
  ObjectReader gemm = reader.get_object("gemm");
  for (const char* name : {"fp64", "fp32", "tf32", "bf16", "fp16", "fp8"}) {
    if (!gemm.has(name)) {
      gemm.accept(name);
      continue;
    }
    ObjectReader g = gemm.get_object(name);
    GemmEfficiency e;
    e.peak_fraction = g.get_number_in("peak_fraction", 1e-3, 1.0, 1.0);
    e.overhead_s = g.get_number("overhead_s", 0, false);
    e.output_half = g.get_number_or("output_half", 0, false, 0);
    e.k_half = g.get_number_or("k_half", 0, false, 0);
    e.latency_s = g.get_number_or("latency_s", 0, false, 0);
    if (g.has("ceiling_fraction")) e.ceiling_fraction = g.get_number_between("ceiling_fraction", 1e-3, 1.0);
    read_notes(g, std::string("gemm.") + name, p);
    g.finish();
    p.gemm[*parse_dtype(name)] = e;
  }
  gemm.finish();
  if (p.gemm.empty() && !p.is_roofline) reader.fail("gemm", "has no dtype", "figures for at least one dtype");
  if (reader.has("gemm_tiling")) {
    ObjectReader t = reader.get_object("gemm_tiling");
    GemmTiling tiling;
    tiling.sm_count = t.get_int("sm_count", 1);
    tiling.tile_m = t.get_int("tile_m", 1);
    tiling.tile_n = t.get_int("tile_n", 1);
    read_notes(t, "gemm_tiling", p);
    t.finish();
    p.gemm_tiling = tiling;
  } else {
    reader.accept("gemm_tiling");
  }
  ObjectReader flash = reader.get_object("flash_attention");
  p.flash_forward_peak_fraction = flash.get_number_in("forward_peak_fraction", 1e-3, 1.0, 1.0);
  p.flash_backward_peak_fraction = flash.get_number_in("backward_peak_fraction", 1e-3, 1.0, 1.0);
  read_notes(flash, "flash_attention", p);
  flash.finish();
  ObjectReader memory = reader.get_object("memory");
  p.memory_bandwidth_fraction = memory.get_number_in("bandwidth_fraction", 1e-3, 1.0, 1.0);
  p.kernel_overhead_s = memory.get_number("kernel_overhead_s", 0, false);
  p.memory_bandwidth_bytes_per_s = optional_number(memory, "bandwidth_bytes_per_s", true);
  read_notes(memory, "memory", p);
  memory.finish();
  ObjectReader links = reader.get_object("links");
  p.intra_node_bus_fraction = links.get_number_in("intra_node_bus_fraction", 1e-3, 1.0, 1.0);
  p.inter_node_bus_fraction = links.get_number_in("inter_node_bus_fraction", 1e-3, 1.0, 1.0);
  p.intra_node_bandwidth_bytes_per_s = optional_number(links, "intra_node_bandwidth_bytes_per_s", true);
  p.intra_node_latency_s = optional_number(links, "intra_node_latency_s", false);
  p.inter_node_latency_s = optional_number(links, "inter_node_latency_s", false);
  if (links.has("inter_node_exchange_fraction")) {
    p.inter_node_exchange_fraction = links.get_number_in("inter_node_exchange_fraction", 1e-3, 1.0, 1.0);
  }
  p.inter_node_rate_bytes_per_s = optional_number(links, "inter_node_rate_bytes_per_s", true);
  read_points(links, json.at("links"), "inter_node_at_rates", [&](ObjectReader& r, size_t i) {
    InterNodeAtRate at;
    at.nic_bandwidth_bytes_per_s = r.get_number("nic_bandwidth_bytes_per_s", 0, true);
    at.bus_fraction = r.get_number_between("bus_fraction", 1e-3, 1.0);
    if (r.has("exchange_fraction")) at.exchange_fraction = r.get_number_between("exchange_fraction", 1e-3, 1.0);
    const std::string key = "inter_node_at_rates[" + std::to_string(i) + "]";
    if (!p.inter_node_rate_bytes_per_s) {
      links.fail(key, "is a rate's figures, but the profile's own rate (inter_node_rate_bytes_per_s) is absent",
                 "inter_node_rate_bytes_per_s beside inter_node_at_rates");
    }
    if (at.nic_bandwidth_bytes_per_s == *p.inter_node_rate_bytes_per_s ||
        (i > 0 && !(p.inter_node_at_rates.back().nic_bandwidth_bytes_per_s < at.nic_bandwidth_bytes_per_s))) {
      links.fail(key, "repeats a rate or is out of order",
                 "rates once each, ascending, none the profile's own (inter_node_rate_bytes_per_s)");
    }
    p.inter_node_at_rates.push_back(at);
  });
  read_notes(links, "links", p);
  links.finish();
  if (reader.has("variability")) {
    ObjectReader v = reader.get_object("variability");
    p.variability.device_speed_cv = v.get_number_in("device_speed_cv", 0, 0.5, 0);
    p.variability.op_time_cv = v.get_number_in("op_time_cv", 0, 0.5, 0);
    p.variability_notes = v.get_string_or("notes", "");
    v.finish();
  } else {
    reader.accept("variability");
  }
  if (reader.has("overlap")) {
    ObjectReader o = reader.get_object("overlap");
    p.overlap.sms = o.get_int("sms", 1);
    auto ctas = [&](const std::string& key) {
      const int64_t n = o.get_int(key, 0);
      if (n >= p.overlap.sms) {
        o.fail(key, std::to_string(n) + " CTAs of " + std::to_string(p.overlap.sms) + " SMs",
               "fewer CTAs than the device has SMs (sms)");
      }
      return n;
    };
    p.overlap.ctas_intra_node = ctas("collective_ctas_intra_node");
    p.overlap.ctas_inter_node = ctas("collective_ctas_inter_node");
    p.overlap_notes = o.get_string_or("notes", "");
    o.finish();
  } else {
    reader.accept("overlap");
  }
  if (reader.has("execution")) {
    ObjectReader e = reader.get_object("execution");
    p.execution_in_order = e.get_bool_or("in_order", false);
    p.execution_staged_sends = e.get_bool_or("staged_sends", false);
    read_notes(e, "execution", p);
    e.finish();
    if (p.execution_staged_sends && !p.execution_in_order) {
      reader.fail("execution", "staged_sends needs in_order", "\"in_order\": true, or no staged_sends");
    }
  } else {
    reader.accept("execution");
  }
  if (reader.has("machine")) {
    ObjectReader m = reader.get_object("machine");
    MachineInfo info;
    info.hostname = m.get_string_or("hostname", "");
    info.cpu_model = m.get_string_or("cpu_model", "");
    info.cores = m.get_int_or("cores", 0, 0);
    m.finish();
    p.machine = info;
  } else {
    reader.accept("machine");
  }
  if (reader.has("libraries")) {
    reader.accept("libraries");
    const Json& libraries = json.at("libraries");
    if (!libraries.is_object()) reader.fail("libraries", "must be a JSON object", "{\"name\": \"version\"}");
    for (const auto& [name, version] : libraries.items()) {
      if (!version.is_string()) reader.fail("libraries", "versions must be strings", "{\"name\": \"version\"}");
      p.libraries[name] = version.get<std::string>();
    }
  } else {
    reader.accept("libraries");
  }
  if (reader.has("measured")) {
    ObjectReader measured = reader.get_object("measured");
    p.measured = parse_measured(measured, json.at("measured"), p.sources);
  } else {
    reader.accept("measured");
  }
  reader.finish();
  return p;
}

DeviceProfile load_profile(const std::string& path) {
  return parse_profile(load_json_file(path), path);
}

Json profile_to_json(const DeviceProfile& p) {
  Json gemm = Json::object();
  for (const auto& [dtype, e] : p.gemm) {
    Json g = {{"peak_fraction", e.peak_fraction}, {"overhead_s", e.overhead_s}};
    if (e.output_half > 0) g["output_half"] = e.output_half;
    if (e.k_half > 0) g["k_half"] = e.k_half;
    if (e.latency_s > 0) g["latency_s"] = e.latency_s;
    if (e.ceiling_fraction > 0) g["ceiling_fraction"] = e.ceiling_fraction;
    gemm[to_string(dtype)] = g;
  }
  Json json = {{"name", p.name},
               {"device", p.device},
               {"backend", p.backend},
               {"roofline", p.is_roofline},
               {"gemm", gemm},
               {"flash_attention",
                {{"forward_peak_fraction", p.flash_forward_peak_fraction},
                 {"backward_peak_fraction", p.flash_backward_peak_fraction}}},
               {"memory",
                {{"bandwidth_fraction", p.memory_bandwidth_fraction},
                 {"kernel_overhead_s", p.kernel_overhead_s}}},
               {"links",
                {{"intra_node_bus_fraction", p.intra_node_bus_fraction},
                 {"inter_node_bus_fraction", p.inter_node_bus_fraction}}}};
  // Optional parts only where present, so older profiles print as they always did.
  if (!p.notes.empty()) json["notes"] = p.notes;
  if (!p.sources.empty()) json["sources"] = p.sources;
  if (p.memory_bandwidth_bytes_per_s) json["memory"]["bandwidth_bytes_per_s"] = *p.memory_bandwidth_bytes_per_s;
  if (p.intra_node_bandwidth_bytes_per_s) {
    json["links"]["intra_node_bandwidth_bytes_per_s"] = *p.intra_node_bandwidth_bytes_per_s;
  }
  if (p.intra_node_latency_s) json["links"]["intra_node_latency_s"] = *p.intra_node_latency_s;
  if (p.inter_node_latency_s) json["links"]["inter_node_latency_s"] = *p.inter_node_latency_s;
  if (p.inter_node_exchange_fraction) {
    json["links"]["inter_node_exchange_fraction"] = *p.inter_node_exchange_fraction;
  }
  if (p.inter_node_rate_bytes_per_s) json["links"]["inter_node_rate_bytes_per_s"] = *p.inter_node_rate_bytes_per_s;
  for (const InterNodeAtRate& at : p.inter_node_at_rates) {
    Json r = {{"nic_bandwidth_bytes_per_s", at.nic_bandwidth_bytes_per_s}, {"bus_fraction", at.bus_fraction}};
    if (at.exchange_fraction) r["exchange_fraction"] = *at.exchange_fraction;
    json["links"]["inter_node_at_rates"].push_back(r);
  }
  if (p.variability.device_speed_cv > 0 || p.variability.op_time_cv > 0 || !p.variability_notes.empty()) {
    json["variability"] = {{"device_speed_cv", p.variability.device_speed_cv},
                           {"op_time_cv", p.variability.op_time_cv}};
    if (!p.variability_notes.empty()) json["variability"]["notes"] = p.variability_notes;
  }
  if (p.overlap.modelled()) {
    json["overlap"] = {{"sms", p.overlap.sms},
                       {"collective_ctas_intra_node", p.overlap.ctas_intra_node},
                       {"collective_ctas_inter_node", p.overlap.ctas_inter_node}};
    if (!p.overlap_notes.empty()) json["overlap"]["notes"] = p.overlap_notes;
  }
  if (p.execution_in_order) {
    json["execution"] = {{"in_order", true}, {"staged_sends", p.execution_staged_sends}};
  }
  if (p.machine) {
    json["machine"] = {{"hostname", p.machine->hostname},
                       {"cpu_model", p.machine->cpu_model},
                       {"cores", p.machine->cores}};
  }
  if (!p.libraries.empty()) json["libraries"] = p.libraries;
  if (p.gemm_tiling) {
    json["gemm_tiling"] = {{"sm_count", p.gemm_tiling->sm_count},
                           {"tile_m", p.gemm_tiling->tile_m},
                           {"tile_n", p.gemm_tiling->tile_n}};
  }
  if (p.measured) json["measured"] = measured_to_json(*p.measured);
  for (const auto& [where, notes] : p.section_notes) {  // into the sections written above
    size_t dot = where.find('.');
    const std::string outer = where.substr(0, dot);
    if (!json.contains(outer)) continue;
    Json* section = &json[outer];
    if (dot != std::string::npos) {
      if (!section->contains(where.substr(dot + 1))) continue;
      section = &(*section)[where.substr(dot + 1)];
    }
    if (section->is_object()) (*section)["notes"] = notes;
  }
  return json;
}

}  // namespace stepcast
