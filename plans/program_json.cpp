// Canonical JSON text of the StepProgram, its SHA-256, and reading it back.
// The writer streams: a 600k-op program is never held as a JSON tree.
#include "program_json.hpp"

#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <unordered_map>

#include "errors.hpp"
#include "op_signature.hpp"
#include "sha256.hpp"
#include "version.hpp"

namespace stepcast {

namespace {

// Appends text to a buffer; hands full buffers to the hash and the stream.
class Sink {
 public:
  Sink(std::ostream* out) : out_(out) { buffer_.reserve(1 << 20); }
  void put(std::string_view s) {
    buffer_.append(s);
    if (buffer_.size() > (1 << 20)) flush();
  }
  void flush() {
    hash_.update(buffer_);
    if (out_) out_->write(buffer_.data(), std::streamsize(buffer_.size()));
    buffer_.clear();
  }
  std::string finish_hash() {
    flush();
    return hash_.hex_digest();
  }
  std::ostream* out() { return out_; }

 private:
  std::ostream* out_;
  std::string buffer_;
  Sha256 hash_;
};

void put_number(std::string& s, double v) {
  char buf[40];
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.007e15) {
    auto r = std::to_chars(buf, buf + sizeof buf, int64_t(v));
    s.append(buf, r.ptr);
  } else {
    auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
    s.append(buf, r.ptr);
  }
}

void put_string(std::string& s, std::string_view v) {
  s += '"';
  if (v.find_first_of("\"\\") == std::string_view::npos) {
    s += v;  // the usual case: nothing to escape
  } else {
    for (char ch : v) {
      if (ch == '"' || ch == '\\') s += '\\';
      s += ch;
    }
  }
  s += '"';
}

template <size_t N>
void put_key(std::string& s, const char (&key)[N]) {
  s += ",\"";
  s.append(key, N - 1);
  s += "\":";
}

template <typename T>
void put_int_list(std::string& s, const std::vector<T>& v) {
  s += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    put_number(s, double(v[i]));
  }
  s += ']';
}

// The alloc op of each live buffer of a role, as its ops are walked in order (keys: the ops' names).
using LiveAllocs = std::unordered_map<std::string_view, const Op*>;
// find_signature of each (kind, grad, phase, name) met: a walk of the table per op otherwise.
using Signatures = std::unordered_map<uint32_t, const OpSignature*>;

void track_alloc(LiveAllocs& live, const Op& op) {
  if (op.kind == OpKind::alloc) live[op.buffer] = &op;
}

// Operands by slot: [{"slot":NAME,"buffer":NAME,"dtype":DTYPE,"shape":[...]}, ...].
void put_operands(std::string& s, const std::vector<std::string>& buffers,
                  const std::vector<const Slot*>& slots, const LiveAllocs& live) {
  s += '[';
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (i) s += ',';
    auto it = live.find(buffers[i]);
    STEPCAST_CHECK(it != live.end(), "program.json: operand '" + buffers[i] + "' is not allocated");
    s += "{\"slot\":";
    put_string(s, slots[i]->name);
    put_key(s, "buffer");
    put_string(s, buffers[i]);
    put_key(s, "dtype");
    put_string(s, to_string(it->second->dtype));
    put_key(s, "shape");
    put_int_list(s, it->second->shape);
    s += '}';
  }
  s += ']';
}

void put_op(std::string& s, const Op& op, const LiveAllocs& live, Signatures& signatures) {
  s += "{\"id\":";
  put_number(s, op.id);
  put_key(s, "kind");
  put_string(s, to_string(op.kind));
  put_key(s, "stream");
  put_string(s, to_string(op.stream));
  put_key(s, "phase");
  put_string(s, to_string(op.phase));
  if (op.name != OpName::none) { put_key(s, "name"); put_string(s, to_string(op.name)); }
  if (op.grad != Grad::none) { put_key(s, "grad"); put_string(s, to_string(op.grad)); }
  if (op.layer >= 0) { put_key(s, "layer"); put_number(s, op.layer); }
  if (op.microbatch >= 0) { put_key(s, "microbatch"); put_number(s, op.microbatch); }
  if (op.chunk >= 0) { put_key(s, "chunk"); put_number(s, op.chunk); }
  put_key(s, "deps");
  put_int_list(s, op.deps);
  if (op.kind == OpKind::alloc || op.kind == OpKind::free) {
    put_key(s, "buffer");
    put_string(s, op.buffer);
    put_key(s, "class");
    put_string(s, to_string(op.buffer_class));
    put_key(s, "bytes");
    put_number(s, op.bytes);
    if (op.kind == OpKind::alloc) {
      put_key(s, "dtype");
      put_string(s, to_string(op.dtype));
      put_key(s, "shape");
      put_int_list(s, op.shape);
      if (op.persistent) { put_key(s, "persistent"); s += "true"; }
    }
    s += '}';
    return;
  }
  SlotBinding binding;
  if (!op.inputs.empty() || !op.outputs.empty()) {
    const uint32_t key =
        uint32_t(op.kind) | uint32_t(op.grad) << 8 | uint32_t(op.phase) << 16 | uint32_t(op.name) << 24;
    auto [known, added] = signatures.try_emplace(key, nullptr);
    if (added) known->second = find_signature(op);
    const OpSignature* signature = known->second;
    STEPCAST_CHECK(signature, std::string("program.json: no signature for op ") +
                                  std::to_string(op.id) + " (" + to_string(op.kind) + " " +
                                  to_string(op.name) + ")");
    binding = bind_slots(*signature, op);
    STEPCAST_CHECK(binding.error.empty(), "program.json: op " + std::to_string(op.id) + ": " + binding.error);
  }
  put_key(s, "inputs");
  put_operands(s, op.inputs, binding.inputs, live);
  put_key(s, "outputs");
  put_operands(s, op.outputs, binding.outputs, live);
  if (op.batch > 0) {
    put_key(s, "batch"); put_number(s, double(op.batch));
    put_key(s, "m"); put_number(s, double(op.m));
    put_key(s, "n"); put_number(s, double(op.n));
    put_key(s, "k"); put_number(s, double(op.k));
  }
  if (op.cp_step >= 0) { put_key(s, "cp_step"); put_number(s, double(op.cp_step)); }
  if (op.fp8_slots[0] >= 0) {
    put_key(s, "fp8_slots");
    put_int_list(s, std::vector<int64_t>(op.fp8_slots.begin(), op.fp8_slots.end()));
  }
  if (is_compute(op.kind)) { put_key(s, "flops"); put_number(s, op.flops); }
  put_key(s, "bytes");
  put_number(s, op.bytes);
  if (is_collective(op.kind)) {
    put_key(s, "group");
    put_string(s, to_string(op.group));
    put_key(s, "algorithm");
    put_string(s, to_string(op.algorithm));
  }
  if (is_p2p(op.kind)) {
    put_key(s, "peer");
    put_string(s, to_string(op.peer));
    put_key(s, "tag");
    put_number(s, double(op.tag));
    if (op.group == GroupKind::tp) {  // a send of this rank's 1/tp slice (scatter_gather_tensors_in_pipeline)
      put_key(s, "group");
      put_string(s, to_string(op.group));
    }
  }
  s += '}';
}

}  // namespace

std::string write_program_json(const StepProgram& program, std::ostream* out) {
  Sink sink(out);
  std::string s = "{\"schema_version\":";
  put_number(s, StepProgram::kSchemaVersion);
  s += ",\"model\":" + program.model.dump();
  s += ",\"topology\":" + program.topology.dump();
  s += ",\"plan\":" + program.plan.dump();
  s += ",\"grid\":{\"tp_size\":";
  put_number(s, double(program.tp_size));
  put_key(s, "dp_size");
  put_number(s, double(program.dp_size));
  put_key(s, "pp_size");
  put_number(s, double(program.pp_size));
  if (program.cp_size > 1) {  // absent: 1 (programs without cp keep their bytes and hash)
    put_key(s, "cp_size");
    put_number(s, double(program.cp_size));
  }
  put_key(s, "dp_shard_size");
  put_number(s, double(program.dp_shard_size == 0 ? program.dp_size * program.cp_size : program.dp_shard_size));
  if (program.moe.num_experts > 0) {  // absent: 1 (programs without experts keep their bytes and hash)
    put_key(s, "ep_size");
    put_number(s, double(program.ep_size));
    put_key(s, "etp_size");
    put_number(s, double(program.etp_size));
  }
  put_key(s, "order");
  put_string(s, program.order);
  put_key(s, "devices_per_node");
  put_number(s, double(program.devices_per_node));
  s += '}';
  put_key(s, "num_microbatches");
  put_number(s, double(program.num_microbatches));
  put_key(s, "tokens_per_step");
  put_number(s, double(program.tokens_per_step));
  if (program.async_staleness > 0) {  // absent: synchronous
    put_key(s, "async_staleness");
    put_number(s, double(program.async_staleness));
  }
  if (program.moe.num_experts > 0) {  // absent: no experts
    s += ",\"moe\":" + Json{{"num_experts", program.moe.num_experts},
                              {"top_k", program.moe.top_k},
                              {"capacity_factor", program.moe.capacity_factor},
                              {"routing_shares", program.moe.routing_shares},
                              {"routing_seed", program.moe.routing_seed},
                              {"routed_tokens", program.moe.routed_tokens},
                              {"expert_capacity_rows", program.moe.expert_capacity_rows}}.dump();
  }
  if (program.fp8.enabled()) {  // absent: no FP8
    s += ",\"fp8\":{\"format\":";
    put_string(s, to_string(program.fp8.format));
    put_key(s, "recipe");
    put_string(s, to_string(program.fp8.scaling));
    put_key(s, "amax_history_len");
    put_number(s, double(program.fp8.amax_history_len));
    put_key(s, "amax_compute_algo");
    put_string(s, to_string(program.fp8.amax_compute_algo));
    put_key(s, "margin");
    put_number(s, double(program.fp8.margin));
    put_key(s, "slots");
    put_number(s, double(program.fp8_slots));
    s += '}';
  }
  s += ",\"roles\":[";
  sink.put(s);
  for (size_t r = 0; r < program.roles.size(); ++r) {
    const Role& role = program.roles[r];
    s.clear();
    if (r) s += ',';
    s += "{\"index\":";
    put_number(s, role.index);
    put_key(s, "pp_stage");
    put_number(s, double(role.pp_stage));
    put_key(s, "chunk_virtual_stages");
    put_int_list(s, role.chunks_virtual_stages);
    s += ",\"ops\":[\n";
    sink.put(s);
    LiveAllocs live;
    Signatures signatures;
    for (size_t i = 0; i < role.ops.size(); ++i) {
      s.clear();
      if (i) s += ",\n";
      track_alloc(live, role.ops[i]);
      put_op(s, role.ops[i], live, signatures);
      sink.put(s);
    }
    sink.put("]}");
  }
  sink.put("]");
  std::string hash = sink.finish_hash();
  if (out) {
    *out << ",\"program_sha256\":\"" << hash << "\",\"generator\":{\"stepcast_version\":\""
         << stepcast_version() << "\",\"git_commit\":\"" << stepcast_git_commit() << "\"}}\n";
  }
  return hash;
}

void hash_program(StepProgram& program) {
  program.program_sha256 = write_program_json(program, nullptr);
}

namespace {

template <typename E>
E parse_enum(const Json& v, E last, const std::string& file, const std::string& key) {
  std::string text = v.get<std::string>();
  for (int i = 0; i <= int(last); ++i) {
    if (text == to_string(E(i))) return E(i);
  }
  throw InputError(file + ": key '" + key + "' = \"" + text + "\": unknown value");
}

GroupKind parse_group(const Json& v, const std::string& file) {
  std::string text = v.get<std::string>();
  for (GroupKind k : all_group_kinds()) {
    if (text == to_string(k)) return k;
  }
  throw InputError(file + ": key 'group' = \"" + text + "\": unknown value");
}

OpName parse_name(const Json& op, const std::string& file) {
  if (!op.contains("name")) return OpName::none;
  std::string text = op.at("name").get<std::string>();
  std::optional<OpName> name = parse_op_name(text);
  if (!name) {
    throw_input_error(file, "name", Json(text).dump(), "unknown op name", valid_op_names());
  }
  return *name;
}

// An op's operands (version 2: by slot, with dtype and shape) as buffer names.
std::vector<std::string> parse_operands(const Json& list, const char* key, const std::string& file) {
  std::vector<std::string> buffers;
  if (!list.is_array()) throw_input_error(file, key, printable_excerpt(list.dump()), "not a list", "a list of operands");
  for (const Json& o : list) {
    if (!o.is_object() || !o.contains("buffer") || !o.at("buffer").is_string()) {
      throw_input_error(file, key, printable_excerpt(o.dump()), "not an operand",
                        "{\"slot\": NAME, \"buffer\": NAME, \"dtype\": DTYPE, \"shape\": [...]}");
    }
    buffers.push_back(o.at("buffer").get<std::string>());
  }
  return buffers;
}

// Every operand must be the buffer of the slot its signature gives it, live, with the dtype and
// shape of its alloc.
void check_operands(const Json& jo, const Op& op, const LiveAllocs& live, const std::string& file) {
  if (op.inputs.empty() && op.outputs.empty()) return;
  const OpSignature* signature = find_signature(op);
  std::string what = "op " + std::to_string(op.id) + " (" + to_string(op.kind) + " " +
                     to_string(op.name) + ")";
  if (!signature) {
    throw_input_error(file, "name", Json(to_string(op.name)).dump(),
                      what + " has no signature in phase " + to_string(op.phase) + " with grad '" +
                          to_string(op.grad) + "'",
                      "an op of stepcast's signature table (op_signature.cpp)");
  }
  SlotBinding binding = bind_slots(*signature, op);
  if (!binding.error.empty()) {
    throw_input_error(file, "inputs", printable_excerpt(jo.at("inputs").dump()), what + ": " + binding.error, "the operands of its signature");
  }
  auto check = [&](const char* key, const std::vector<std::string>& buffers,
                   const std::vector<const Slot*>& slots) {
    const Json& list = jo.at(key);
    for (size_t i = 0; i < buffers.size(); ++i) {
      const Json& o = list[i];
      std::string at = std::string(key) + "[" + std::to_string(i) + "]";
      std::string slot = o.value("slot", "");
      if (slot != slots[i]->name) {
        throw_input_error(file, at + ".slot", Json(slot).dump(), what + ": not the slot of this operand",
                          Json(slots[i]->name).dump());
      }
      auto it = live.find(buffers[i]);
      if (it == live.end()) {
        throw_input_error(file, at + ".buffer", Json(buffers[i]).dump(),
                          what + ": the buffer is not allocated here", "a live buffer of the role");
      }
      std::string dtype = o.value("dtype", "");
      if (dtype != to_string(it->second->dtype)) {
        throw_input_error(file, at + ".dtype", Json(dtype).dump(), what + ": not its alloc's dtype",
                          Json(to_string(it->second->dtype)).dump());
      }
      if (!o.contains("shape") || o.at("shape") != Json(it->second->shape)) {
        throw_input_error(file, at + ".shape", printable_excerpt(o.value("shape", Json()).dump()),
                          what + ": not its alloc's shape", Json(it->second->shape).dump());
      }
    }
  };
  check("inputs", op.inputs, binding.inputs);
  check("outputs", op.outputs, binding.outputs);
}

Grad parse_op_grad(const Json& op, const std::string& file) {
  if (!op.contains("grad")) return Grad::none;
  std::string text = op.at("grad").get<std::string>();
  std::optional<Grad> grad = parse_grad(text);
  if (!grad) throw_input_error(file, "grad", Json(text).dump(), "unknown gradient", "dgrad, wgrad");
  return *grad;
}

}  // namespace

StepProgram read_program_json(const std::string& path) {
  return parse_program_json_text(read_text_file(path), path);
}

StepProgram parse_program_json_text(const std::string& text, const std::string& path) {
  const std::string marker = ",\"program_sha256\":\"";
  size_t at = text.rfind(marker);
  if (at == std::string::npos) {
    throw InputError(path + ": not a complete stepcast program (no program_sha256; truncated?)");
  }
  std::string recorded = text.substr(at + marker.size(), 64);
  std::string actual = sha256_hex(std::string_view(text).substr(0, at));
  if (recorded != actual) {
    throw InputError(path + ": program_sha256 " + recorded + " does not match its content (" +
                     actual + "): the file was altered");
  }
  Json j = parse_json_text(text, path);
  try {
    StepProgram p;
    const Json& version = j.at("schema_version");
    if (version != Json(StepProgram::kSchemaVersion)) {
      std::string why = version == Json(1)
          ? "a program.json of an older stepcast (version 1: operands without slots and shapes)"
          : "not a program.json version this stepcast reads";
      throw InputError(path + ": key 'schema_version' = " + printable_excerpt(version.dump()) + ": " + why +
                       "; valid: " + std::to_string(StepProgram::kSchemaVersion) +
                       ". Regenerate it: stepcast lower --model M --topology T --plan P --out DIR");
    }
    p.model = j.at("model");
    p.topology = j.at("topology");
    p.plan = j.at("plan");
    // Integers checked before they are converted (a double such as 1e300 does not fit).
    constexpr int64_t kLarge = int64_t(1) << 62;
    auto integer = [&](const Json& v, const std::string& key, int64_t lo, int64_t hi) {
      bool fits = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi));
      int64_t x = fits ? v.get<int64_t>() : 0;
      if (!fits || x < lo || x > hi) {
        throw InputError(path + ": key '" + key + "' = " + printable_excerpt(v.dump()) +
                         ": out of range; valid: an integer in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "]");
      }
      return x;
    };
    auto integers = [&](const Json& v, const std::string& key, int64_t lo, int64_t hi) {
      std::vector<int64_t> out;
      for (const Json& x : v.get_ref<const Json::array_t&>()) out.push_back(integer(x, key, lo, hi));
      return out;
    };
    const Json& g = j.at("grid");
    p.tp_size = integer(g.at("tp_size"), "tp_size", 1, 1 << 24);
    p.dp_size = integer(g.at("dp_size"), "dp_size", 1, 1 << 24);
    p.pp_size = integer(g.at("pp_size"), "pp_size", 1, 1 << 24);
    p.cp_size = g.contains("cp_size") ? integer(g.at("cp_size"), "cp_size", 1, 1 << 24) : 1;
    // Absent in programs written before hybrid sharding existed: they shard over the whole dp.
    p.dp_shard_size = g.contains("dp_shard_size") ? integer(g.at("dp_shard_size"), "dp_shard_size", 1, 1 << 24)
                                                  : p.dp_size * p.cp_size;
    if (p.dp_size * p.cp_size % p.dp_shard_size != 0) {
      throw InputError(path + ": key 'grid.dp_shard_size' = " + std::to_string(p.dp_shard_size) +
                       ": does not divide grid.dp_size · grid.cp_size = " + std::to_string(p.dp_size * p.cp_size) +
                       "; valid: a divisor of dp_size · cp_size");
    }
    if (g.contains("ep_size")) {
      p.ep_size = integer(g.at("ep_size"), "ep_size", 1, 1 << 24);
      p.etp_size = integer(g.at("etp_size"), "etp_size", 1, 1 << 24);
      if ((p.tp_size * p.cp_size * p.dp_size) % (p.ep_size * p.etp_size) != 0) {
        throw InputError(path + ": key 'grid.ep_size' = " + std::to_string(p.ep_size) +
                         ": ep_size · etp_size does not divide tp_size · cp_size · dp_size; valid: a divisor");
      }
    }
    if (j.contains("moe")) {
      const Json& m = j.at("moe");
      p.moe.num_experts = integer(m.at("num_experts"), "moe.num_experts", 1, 1 << 24);
      p.moe.top_k = integer(m.at("top_k"), "moe.top_k", 1, p.moe.num_experts);
      p.moe.capacity_factor = m.at("capacity_factor").get<double>();
      p.moe.routing_shares = m.at("routing_shares").get<std::vector<double>>();
      p.moe.routing_seed = m.at("routing_seed").get<uint64_t>();
      p.moe.routed_tokens = integer(m.at("routed_tokens"), "moe.routed_tokens", 1, kLarge);
      p.moe.expert_capacity_rows = integer(m.at("expert_capacity_rows"), "moe.expert_capacity_rows", 0, kLarge);
      if (int64_t(p.moe.routing_shares.size()) != p.moe.num_experts) {
        throw InputError(path + ": key 'moe.routing_shares': " + std::to_string(p.moe.routing_shares.size()) +
                         " entries; valid: one per expert (" + std::to_string(p.moe.num_experts) + ")");
      }
    }
    p.order = g.at("order");
    p.devices_per_node = integer(g.at("devices_per_node"), "devices_per_node", 1, 1 << 24);
    p.num_microbatches = integer(j.at("num_microbatches"), "num_microbatches", 1, kLarge);
    p.tokens_per_step = integer(j.at("tokens_per_step"), "tokens_per_step", 0, kLarge);
    p.async_staleness = integer(j.value("async_staleness", Json(0)), "async_staleness", 0, 1 << 20);
    if (j.contains("fp8")) {
      const Json& f = j.at("fp8");
      std::string format = f.at("format").get<std::string>();
      std::string algo = f.at("amax_compute_algo").get<std::string>();
      std::string recipe = f.at("recipe").get<std::string>();
      if ((format != "e4m3" && format != "hybrid") || (algo != "most_recent" && algo != "max") ||
          (recipe != "delayed" && recipe != "tensorwise")) {
        throw InputError(path + ": key 'fp8' = " + printable_excerpt(f.dump()) +
                         ": valid: format e4m3 or hybrid, recipe delayed or tensorwise, amax_compute_algo "
                         "most_recent or max");
      }
      p.fp8.format = format == "e4m3" ? Fp8Format::e4m3 : Fp8Format::hybrid;
      p.fp8.scaling = recipe == "tensorwise" ? Fp8Scaling::current : Fp8Scaling::delayed;
      p.fp8.amax_compute_algo = algo == "max" ? Fp8AmaxAlgo::max : Fp8AmaxAlgo::most_recent;
      p.fp8.amax_history_len = integer(f.at("amax_history_len"), "fp8.amax_history_len", 1, 1 << 20);
      p.fp8.margin = integer(f.at("margin"), "fp8.margin", 0, 1000);
      p.fp8_slots = integer(f.at("slots"), "fp8.slots", 1, kLarge);
    }
    for (const Json& jr : j.at("roles")) {
      Role role;
      role.index = int32_t(integer(jr.at("index"), "index", 0, 1 << 24));
      role.pp_stage = integer(jr.at("pp_stage"), "pp_stage", 0, 1 << 24);
      role.chunks_virtual_stages = integers(jr.at("chunk_virtual_stages"), "chunk_virtual_stages", 0, kLarge);
      auto int32_of = [&](const Json& v, const char* key) {
        return int32_t(integer(v, key, -1, std::numeric_limits<int32_t>::max()));
      };
      for (const Json& jo : jr.at("ops")) {
        Op op;
        op.id = int32_of(jo.at("id"), "id");
        if (op.id != int32_t(role.ops.size())) {
          throw InputError(path + ": key 'id' = " + std::to_string(op.id) + ": out of order; valid: " +
                           std::to_string(role.ops.size()) + " (an op's id is its index in its role)");
        }
        op.kind = parse_enum(jo.at("kind"), OpKind::free, path, "kind");
        op.stream = parse_enum(jo.at("stream"), Stream::p2p, path, "stream");
        op.phase = parse_enum(jo.at("phase"), Phase::optimizer, path, "phase");
        op.name = parse_name(jo, path);
        op.grad = parse_op_grad(jo, path);
        op.layer = int32_of(jo.value("layer", Json(-1)), "layer");
        op.microbatch = int32_of(jo.value("microbatch", Json(-1)), "microbatch");
        op.chunk = int32_of(jo.value("chunk", Json(-1)), "chunk");
        for (const Json& d : jo.at("deps")) op.deps.push_back(int32_of(d, "deps"));
        op.bytes = jo.at("bytes");
        if (op.kind == OpKind::alloc || op.kind == OpKind::free) {
          op.buffer = jo.at("buffer");
          op.buffer_class = parse_enum(jo.at("class"), BufferClass::comm, path, "class");
          if (op.kind == OpKind::alloc) {
            std::string dtype = jo.at("dtype").get<std::string>();
            std::optional<Dtype> parsed = parse_buffer_dtype(dtype);
            if (!parsed) {
              throw InputError(path + ": key 'dtype' = \"" + dtype +
                               "\": unknown value (valid: fp64, fp32, tf32, bf16, fp16, fp8, "
                               "int32, int64, u8, fp8_e4m3, fp8_e5m2)");
            }
            op.dtype = *parsed;
            op.shape = integers(jo.at("shape"), "shape", 0, kLarge);
            op.persistent = jo.value("persistent", false);
          }
        } else {
          op.inputs = parse_operands(jo.at("inputs"), "inputs", path);
          op.outputs = parse_operands(jo.at("outputs"), "outputs", path);
          op.batch = integer(jo.value("batch", Json(0)), "batch", 0, kLarge);
          op.m = integer(jo.value("m", Json(0)), "m", 0, kLarge);
          op.n = integer(jo.value("n", Json(0)), "n", 0, kLarge);
          op.k = integer(jo.value("k", Json(0)), "k", 0, kLarge);
          op.cp_step = int32_t(integer(jo.value("cp_step", Json(-1)), "cp_step", -1, p.cp_size - 1));
          if (jo.contains("fp8_slots")) {
            std::vector<int64_t> slots = integers(jo.at("fp8_slots"), "fp8_slots", -1, p.fp8_slots - 1);
            if (slots.size() != 2 || slots[0] < 0) {
              throw InputError(path + ": key 'fp8_slots' = " + printable_excerpt(jo.at("fp8_slots").dump()) +
                               ": valid: two slots [first, second or -1] below fp8.slots = " +
                               std::to_string(p.fp8_slots));
            }
            op.fp8_slots = {int32_t(slots[0]), int32_t(slots[1])};
          }
          op.flops = jo.value("flops", 0.0);
          if (is_collective(op.kind)) {
            op.group = parse_group(jo.at("group"), path);
            op.algorithm = parse_enum(jo.at("algorithm"), Algorithm::pairwise, path, "algorithm");
          }
          if (is_p2p(op.kind)) {
            op.peer = parse_enum(jo.at("peer"), Peer::cp_prev, path, "peer");
            op.tag = integer(jo.at("tag"), "tag", -1, kLarge);
            if (jo.contains("group")) {
              op.group = parse_group(jo.at("group"), path);
              if (op.kind != OpKind::send || op.group != GroupKind::tp) {
                throw InputError(path + ": op " + std::to_string(op.id) + ": key 'group' = \"" +
                                 to_string(op.group) + "\" on a " + to_string(op.kind) +
                                 "; valid: \"tp\" on a send (its rank's 1/tp slice), or no group");
              }
            }
          }
        }
        role.ops.push_back(std::move(op));
      }
      // Operands are checked against allocs that point into role.ops: now that it is whole.
      LiveAllocs allocs;
      const Json& ops = jr.at("ops");
      for (size_t i = 0; i < role.ops.size(); ++i) {
        track_alloc(allocs, role.ops[i]);
        if (role.ops[i].kind != OpKind::alloc && role.ops[i].kind != OpKind::free) {
          check_operands(ops[i], role.ops[i], allocs, path);
        }
      }
      p.roles.push_back(std::move(role));
    }
    p.program_sha256 = recorded;
    return p;
  } catch (const Json::exception& e) {
    throw InputError(path + ": not a valid stepcast program: " + e.what());
  }
}

}  // namespace stepcast
