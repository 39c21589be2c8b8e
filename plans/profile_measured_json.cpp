// A device profile's measured tables as a file section: strict reading (points sorted and unique,
// sources named) and writing back; profile_json.cpp reads and writes the rest of the profile.
#include <cmath>
#include <sstream>
#include <tuple>

#include "collective.hpp"
#include "cost_model.hpp"
#include "profile_json_detail.hpp"

namespace stepcast {

namespace {

const std::vector<std::string> kGemmVariants = {"forward", "dgrad", "wgrad"};
const std::vector<std::string> kCollectiveKinds = {"all_reduce", "reduce_scatter", "all_gather",
                                                   "all_to_all"};
const std::vector<std::string> kCollectiveAlgorithms = {"ring", "tree", "mpi", "nccl"};
const std::vector<std::string> kAttentionPasses = {"forward", "backward", "forward_backward"};
const std::vector<std::string> kTableDtypes = {"fp64", "fp32", "tf32", "bf16", "fp16", "fp8"};

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

void put_source(Json& point, const std::string& source) {
  if (!source.empty()) point["source"] = source;
}

}  // namespace

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
  // Send tables: inside a node, across nodes.
  for (const auto& table : {std::pair{"p2p_points", &t.p2p}, std::pair{"p2p_inter_node_points", &t.p2p_inter_node}}) {
    const char* key = table.first;
    std::vector<P2pPoint>* points = table.second;  // (a plain variable: lambdas capture it under C++17)
    Order<int, double> order(reader, key, "bytes");
    read_points(reader, json, key, [&](ObjectReader& p, size_t i) {
      P2pPoint q;
      q.bytes = p.get_number("bytes", 0, true);
      q.time_s = point_time(p, "bandwidth_bytes_per_s", q.bytes);
      q.source = read_source(p, sources);
      order.check(i, 0, q.bytes);
      points->push_back(q);
    });
  }
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
  Json p2p_inter = Json::array();
  for (auto [points, into] : {std::pair{&t.p2p, &p2p}, std::pair{&t.p2p_inter_node, &p2p_inter}}) {
    for (const P2pPoint& q : *points) {
      Json j = {{"bytes", q.bytes}, {"time_s", q.time_s}, {"bandwidth_bytes_per_s", q.bytes / q.time_s}};
      put_source(j, q.source);
      into->push_back(j);
    }
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

}  // namespace stepcast
