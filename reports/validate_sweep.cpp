// Reading and checking validate sweep files; see validate_sweep.hpp.
#include "validate_sweep.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <regex>
#include <set>

#include "errors.hpp"

namespace stepcast {

namespace {

const char* const kNameValid = "letters, digits, '.', '_' and '-' (it names a folder)";

bool is_safe_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
         });
}

std::string read_name(ObjectReader& reader, const std::string& key) {
  std::string name = reader.get_string(key);
  if (!is_safe_name(name)) reader.fail(key, "not usable as a folder name", kNameValid);
  return name;
}

// A path of the sweep file, relative to the file's folder unless absolute.
std::string resolve(const std::string& sweep_file, const std::string& path) {
  std::filesystem::path p(path);
  if (p.is_absolute()) return path;
  std::filesystem::path base = std::filesystem::path(sweep_file).parent_path();
  return (base / p).lexically_normal().string();
}

// A key whose value is a path (string) to a file that must exist.
std::string read_path(ObjectReader& reader, const std::string& key, const std::string& what) {
  std::string value = reader.get_string(key);
  std::string path = resolve(reader.file(), value);
  std::error_code ec;  // a name too long for the system: no such file either
  if (!std::filesystem::is_regular_file(path, ec)) {
    bool missing = !ec || ec == std::errc::no_such_file_or_directory;
    reader.fail(key, (missing ? std::string("no such file") : ec.message()) + " (" + path + ")",
                "a path to " + what + ", absolute or relative to the sweep file's folder");
  }
  return path;
}

// What `defaults` holds; every field optional.
struct PointDefaults {
  std::optional<std::string> model_file;
  std::optional<Json> plan;              // a plan object (a plan file's contents, or inline)
  std::optional<std::string> plan_file;  // when `plan` came from a file
  std::optional<int64_t> steps;
};

// "plan": a path to a plan file, or an object of plan keys (merged over `base` when there is one).
void read_plan(ObjectReader& reader, const Json& object, const PointDefaults* base,
               std::optional<Json>& plan, std::optional<std::string>& plan_file) {
  const std::string valid =
      "a path to a plan file (examples/*.json), or an object of plan keys that override the "
      "defaults' plan";
  reader.accept("plan");
  const Json& value = object.at("plan");
  if (value.is_string()) {
    std::string path = read_path(reader, "plan", "a plan file (examples/*.json)");
    plan = load_json_file(path);
    plan_file = path;
  } else if (value.is_object()) {
    Json merged = base && base->plan ? *base->plan : Json::object();
    for (auto it = value.begin(); it != value.end(); ++it) merged[it.key()] = it.value();
    plan = merged;
    plan_file.reset();
  } else {
    reader.fail("plan", "wrong type", valid);
  }
}

PointDefaults read_defaults(ObjectReader& reader, const Json& object) {
  PointDefaults d;
  if (reader.has("model")) d.model_file = read_path(reader, "model", "a model file (models/*.json)");
  if (reader.has("plan")) read_plan(reader, object, nullptr, d.plan, d.plan_file);
  if (reader.has("steps")) d.steps = reader.get_int("steps", kSweepMinSteps);
  reader.get_string_or("notes", "");  // text for people: read to check its type
  reader.finish();
  return d;
}

const char* kLinkRateValid = "a rate as tc writes it: NUMBER followed by bit, kbit, mbit or gbit (\"200mbit\")";

SweepPoint read_point(ObjectReader& reader, const Json& object, const PointDefaults& defaults,
                      const Topology& topology, const std::optional<SweepCluster>& netns) {
  SweepPoint p;
  p.name = read_name(reader, "name");
  reader.get_string_or("notes", "");  // text for people: read to check its type
  if (reader.has("link_rate")) {
    if (!netns) reader.fail("link_rate", "only in a sweep with \"netns\" (a cluster on this machine)", "no link_rate");
    p.link_rate = reader.get_string("link_rate");
    if (!is_link_rate(p.link_rate)) reader.fail("link_rate", "not a rate", kLinkRateValid);
  } else if (netns) {
    p.link_rate = netns->link_rate;
  }
  if (reader.has("uplink_rate")) {
    if (!netns) reader.fail("uplink_rate", "only in a sweep with \"netns\" (a cluster on this machine)", "no uplink_rate");
    p.uplink_rate = reader.get_string("uplink_rate");
    if (!is_link_rate(p.uplink_rate)) reader.fail("uplink_rate", "not a rate", kLinkRateValid);
    if (netns->nodes % 2 != 0) {
      reader.fail("uplink_rate", "the cluster has " + std::to_string(netns->nodes) + " nodes",
                  "a cluster of an even number of nodes (two leaves of N/2 joined by the uplink)");
    }
  }
  if (reader.has("nics_per_node")) {
    if (!netns) reader.fail("nics_per_node", "only in a sweep with \"netns\" (a cluster on this machine)", "no nics_per_node");
    p.nics_per_node = reader.get_int("nics_per_node", 1);
    if (p.nics_per_node > 4) reader.fail("nics_per_node", "more than the cluster script makes", "1 to 4");
  }
  if (reader.has("model")) {
    p.model_file = read_path(reader, "model", "a model file (models/*.json)");
  } else if (defaults.model_file) {
    reader.accept("model");
    p.model_file = *defaults.model_file;
  } else {
    reader.fail("model", "missing required key (and no defaults.model)",
                "a path to a model file (models/*.json)");
  }
  std::optional<Json> plan = defaults.plan;
  std::optional<std::string> plan_file = defaults.plan_file;
  if (reader.has("plan")) {
    read_plan(reader, object, &defaults, plan, plan_file);
  } else if (!plan) {
    reader.fail("plan", "missing required key (and no defaults.plan)",
                "a path to a plan file, or an object of plan keys");
  }
  if (reader.has("steps") || !defaults.steps) {
    p.steps = reader.get_int("steps", kSweepMinSteps);
  } else {
    reader.accept("steps");
    p.steps = *defaults.steps;
  }
  p.ranks = reader.get_int("ranks", 1);
  p.measured_routing = reader.get_enum_or("routing", {"plan", "measured"}, "plan") == "measured";
  reader.finish();

  // The plan, as simulate and run will read it: named after the point when inline.
  p.plan_json = *plan;
  p.plan_file = plan_file.value_or("");
  if (!p.plan_json.contains("name")) p.plan_json["name"] = p.name;
  std::string plan_label = plan_file ? *plan_file
                                     : reader.file() + " (" + reader.key_path("plan") + ")";
  p.model = load_model(p.model_file);
  p.plan = parse_plan(p.plan_json, plan_label);
  if (p.measured_routing && (!p.model.is_moe() || p.plan.moe.routing != RoutingKind::uniform)) {
    reader.fail("routing", "\"measured\" measures a mixture of experts' routing, and " +
                               (!p.model.is_moe() ? "the model " + p.model_file + " has no experts"
                                                  : "the plan names its own (moe_routing " +
                                                        std::string(to_string(p.plan.moe.routing)) + ")"),
                "\"plan\" (the plan's routing), or a MoE model whose plan leaves moe_routing uniform");
  }
  // A point's world is its ranks: dp_size absent is ranks / (tp·pp·cp), written into the plan
  // that simulate and run read (their world would be the topology's devices).
  validate_plan(p.plan, p.model, topology, {p.ranks, reader.file() + " (" + reader.key_path("ranks") + ")"});
  if (p.plan.dp_size_derived) p.plan_json["dp_size"] = p.plan.dp_size;
  const int64_t needed = p.plan.world_size() + p.plan.parameter_servers;
  if (needed != p.ranks) {
    reader.fail("ranks",
                "the plan needs tp_size · pp_size · dp_size = " + std::to_string(p.plan.tp_size) +
                    " · " + std::to_string(p.plan.pp_size) + " · " +
                    std::to_string(p.plan.dp_size) +
                    (p.plan.parameter_servers > 0 ? " + parameter_servers " + std::to_string(p.plan.parameter_servers)
                                                  : std::string()) +
                    " = " + std::to_string(needed) + " ranks",
                std::to_string(needed));
  }
  return p;
}

}  // namespace

int64_t Sweep::max_ranks() const {
  int64_t most = 0;
  for (const SweepPoint& p : points) most = std::max(most, p.ranks);
  return most;
}

const char* to_string(SweepProfileSource source) {
  switch (source) {
    case SweepProfileSource::measure: return "measure";
    case SweepProfileSource::measure_quick: return "measure-quick";
    case SweepProfileSource::file: return "file";
    case SweepProfileSource::roofline: return "roofline";
  }
  return "?";
}

Sweep parse_sweep(const Json& json, const std::string& file) {
  ObjectReader reader(json, file);
  Sweep s;
  s.file = file;
  s.name = read_name(reader, "name");
  s.notes = reader.get_string_or("notes", "");
  s.topology_file = read_path(reader, "topology", "a topology file (topologies/*.json)");
  s.topology = load_topology(s.topology_file);
  if (reader.has("profile")) {
    const Json& value = json.at("profile");
    if (value == "measure") {
      reader.accept("profile");
    } else if (value == "measure-quick") {
      reader.accept("profile");
      s.profile_source = SweepProfileSource::measure_quick;
    } else if (value == "roofline") {
      reader.accept("profile");
      s.profile_source = SweepProfileSource::roofline;
    } else {
      s.profile_source = SweepProfileSource::file;
      s.profile_file = read_path(reader, "profile",
                                 "a device profile; \"measure\" or \"measure-quick\" to "
                                 "measure this machine first; or \"roofline\" for the "
                                 "topology's datasheet peaks");
    }
  } else {
    reader.accept("profile");
  }
  if (reader.has("repeats")) s.repeats = reader.get_int("repeats", 1);
  if (reader.has("netns")) {
    ObjectReader n = reader.get_object("netns");
    SweepCluster c;
    c.name = n.get_string_or("name", "stepcast");
    c.nodes = n.get_int("nodes", 2);
    c.ranks_per_node = n.get_int("ranks_per_node", 1);
    c.link_rate = n.get_string("link_rate");
    if (!is_link_rate(c.link_rate)) n.fail("link_rate", "not a rate", kLinkRateValid);
    n.get_string_or("notes", "");  // text for people: read to check its type
    n.finish();
    if (s.topology.num_nodes != c.nodes || s.topology.node.devices_per_node != c.ranks_per_node) {
      n.fail("nodes", "the topology " + s.topology_file + " has " + std::to_string(s.topology.num_nodes) +
                          " nodes of " + std::to_string(s.topology.node.devices_per_node) +
                          " devices, the cluster " + std::to_string(c.nodes) + " of " +
                          std::to_string(c.ranks_per_node),
             "a topology of the cluster's shape (its num_nodes and devices_per_node)");
    }
    s.netns = c;
  }
  PointDefaults defaults;
  if (reader.has("defaults")) {
    ObjectReader d = reader.get_object("defaults");
    defaults = read_defaults(d, json.at("defaults"));
  }
  reader.accept("points");
  const std::string points_valid = "a non-empty list of points {name, model, plan, ranks, steps}";
  if (!reader.has("points")) reader.fail("points", "missing required key", points_valid);
  const Json& points = json.at("points");
  if (!points.is_array() || points.empty()) reader.fail("points", "must be a non-empty list", points_valid);
  reader.finish();

  std::set<std::string> names;
  for (size_t i = 0; i < points.size(); ++i) {
    ObjectReader point(points[i], file, "points[" + std::to_string(i) + "].");
    s.points.push_back(read_point(point, points[i], defaults, s.topology, s.netns));
    if (!names.insert(s.points.back().name).second) {
      point.fail("name", "duplicate: another point has this name", "a name unique in the sweep");
    }
  }
  return s;
}

Sweep load_sweep(const std::string& path) { return parse_sweep(load_json_file(path), path); }

bool is_link_rate(const std::string& rate) {
  return std::regex_match(rate, std::regex("[0-9]+(\\.[0-9]+)?[kmg]?bit"));
}

void check_sweep_fits_cores(const Sweep& sweep, int64_t cores) {
  for (size_t i = 0; i < sweep.points.size(); ++i) {
    const SweepPoint& p = sweep.points[i];
    if (p.ranks > cores) {
      throw_input_error(sweep.file, "points[" + std::to_string(i) + "].ranks",
                        std::to_string(p.ranks),
                        "point '" + p.name + "' needs more ranks than this machine's " +
                            std::to_string(cores) +
                            " cores (timing runs bind one rank per core, --bind-to core)",
                        "at most " + std::to_string(cores));
    }
  }
}

}  // namespace stepcast
