// Reading program.json back (program_json.hpp): its hash, version, grid and every op, each
// operand checked against its slot and its alloc.
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <span>
#include <sstream>

#include "errors.hpp"
#include "op_signature.hpp"
#include "program_json.hpp"
#include "program_json_detail.hpp"
#include "sha256.hpp"

namespace stepcast {

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
std::vector<BufferName> parse_operands(const Json& list, const char* key, const std::string& file) {
  std::vector<BufferName> buffers;
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
  auto check = [&](const char* key, std::span<const BufferName> buffers,
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
      // (absent: a program from before the key, which padded every capacity)
      p.moe.pad_to_capacity = m.value("pad_to_capacity", p.moe.expert_capacity_rows > 0);
      // (absent: a program from before the key, which dropped by position)
      const std::string policy = m.value("token_drop_policy", std::string("position"));
      if (policy != "probs" && policy != "position") {
        throw InputError(path + ": key 'moe.token_drop_policy' = '" + policy + "'; valid: probs, position");
      }
      p.moe.drop_by_probs = policy == "probs";
      if (int64_t(p.moe.routing_shares.size()) != p.moe.num_experts) {
        throw InputError(path + ": key 'moe.routing_shares': " + std::to_string(p.moe.routing_shares.size()) +
                         " entries; valid: one per expert (" + std::to_string(p.moe.num_experts) + ")");
      }
      if (m.contains("routing_samples")) {
        p.moe.routing_samples = m.at("routing_samples").get<std::vector<std::vector<std::vector<int64_t>>>>();
        for (size_t l = 0; l < p.moe.routing_samples.size(); ++l) {
          for (size_t i = 0; i < p.moe.routing_samples[l].size(); ++i) {
            const std::vector<int64_t>& one = p.moe.routing_samples[l][i];
            int64_t sum = 0;
            for (int64_t c : one) sum += c < 0 ? -(int64_t(1) << 62) : c;
            if (int64_t(one.size()) != p.moe.num_experts || sum <= 0) {
              throw InputError(path + ": key 'moe.routing_samples[" + std::to_string(l) + "][" + std::to_string(i) +
                               "]': " + std::to_string(one.size()) + " counts summing to " + std::to_string(sum) +
                               "; valid: one count >= 0 per expert (" + std::to_string(p.moe.num_experts) +
                               "), some tokens");
            }
          }
        }
      }
      if (m.contains("layer_routing_shares")) {
        p.moe.layer_routing_shares = m.at("layer_routing_shares").get<std::vector<std::vector<double>>>();
        for (size_t l = 0; l < p.moe.layer_routing_shares.size(); ++l) {
          const size_t n = p.moe.layer_routing_shares[l].size();
          if (n != 0 && int64_t(n) != p.moe.num_experts) {
            throw InputError(path + ": key 'moe.layer_routing_shares[" + std::to_string(l) + "]': " +
                             std::to_string(n) + " entries; valid: none (a dense layer) or one per expert (" +
                             std::to_string(p.moe.num_experts) + ")");
          }
        }
      }
    }
    p.order = g.at("order");
    p.devices_per_node = integer(g.at("devices_per_node"), "devices_per_node", 1, 1 << 24);
    p.num_microbatches = integer(j.at("num_microbatches"), "num_microbatches", 1, kLarge);
    p.tokens_per_step = integer(j.at("tokens_per_step"), "tokens_per_step", 0, kLarge);
    p.async_staleness = integer(j.value("async_staleness", Json(0)), "async_staleness", 0, 1 << 20);
    p.parameter_servers = integer(j.value("parameter_servers", Json(0)), "parameter_servers", 0, 1 << 16);
    if (j.contains("microbatches_per_replica")) {
      p.microbatches_per_replica = integers(j.at("microbatches_per_replica"), "microbatches_per_replica", 1, kLarge);
      int64_t most = 0;
      for (int64_t m : p.microbatches_per_replica) most = std::max(most, m);
      if (int64_t(p.microbatches_per_replica.size()) != p.dp_size || most != p.num_microbatches) {
        throw InputError(path + ": key 'microbatches_per_replica' = " +
                         printable_excerpt(j.at("microbatches_per_replica").dump()) +
                         ": valid: one count per data-parallel replica (grid dp " + std::to_string(p.dp_size) +
                         "), the largest equal to num_microbatches = " + std::to_string(p.num_microbatches));
      }
      p.index_replica_classes();
    }
    if (j.contains("fp8")) {
      const Json& f = j.at("fp8");
      std::string format = f.at("format").get<std::string>();
      std::string algo = f.at("amax_compute_algo").get<std::string>();
      std::string recipe = f.at("recipe").get<std::string>();
      if ((format != "e4m3" && format != "hybrid") || (algo != "most_recent" && algo != "max") ||
          !parse_fp8_scaling(recipe)) {
        throw InputError(path + ": key 'fp8' = " + printable_excerpt(f.dump()) +
                         ": valid: format e4m3 or hybrid, recipe delayed, tensorwise, mxfp8 or blockwise, "
                         "amax_compute_algo most_recent or max");
      }
      p.fp8.format = format == "e4m3" ? Fp8Format::e4m3 : Fp8Format::hybrid;
      p.fp8.scaling = *parse_fp8_scaling(recipe);
      p.fp8.amax_compute_algo = algo == "max" ? Fp8AmaxAlgo::max : Fp8AmaxAlgo::most_recent;
      p.fp8.amax_history_len = integer(f.at("amax_history_len"), "fp8.amax_history_len", 1, 1 << 20);
      p.fp8.margin = integer(f.at("margin"), "fp8.margin", 0, 1000);
      p.fp8_slots = integer(f.at("slots"), "fp8.slots", 1, kLarge);
      if (f.contains("block_scales")) {
        if (f.at("block_scales") != "fp32" || p.fp8.scaling != Fp8Scaling::blockwise) {
          throw InputError(path + ": key 'fp8.block_scales' = " + printable_excerpt(f.at("block_scales").dump()) +
                           ": valid: \"fp32\" with recipe blockwise, or absent (powers of two)");
        }
        p.fp8.power_of_two_scales = false;
      }
      if (f.contains("param_gather")) {
        if (f.at("param_gather") != true || (!p.fp8.delayed() && !p.fp8.current())) {
          throw InputError(path + ": key 'fp8.param_gather' = " + printable_excerpt(f.at("param_gather").dump()) +
                           ": valid: true with recipe delayed or tensorwise, or absent (off)");
        }
        p.fp8.param_gather = true;
      }
    }
    for (const Json& jr : j.at("roles")) {
      Role role;
      role.index = int32_t(integer(jr.at("index"), "index", 0, 1 << 24));
      role.pp_stage = integer(jr.at("pp_stage"), "pp_stage", 0, 1 << 24);
      role.chunks_virtual_stages = integers(jr.at("chunk_virtual_stages"), "chunk_virtual_stages", 0, kLarge);
      role.num_microbatches = integer(jr.value("num_microbatches", Json(p.num_microbatches)), "num_microbatches", 1,
                                      p.num_microbatches);
      role.server = int32_t(integer(jr.value("server", Json(-1)), "server", -1, p.parameter_servers - 1));
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
          op.buffer = jo.at("buffer").get<std::string>();
          op.buffer_class = parse_enum(jo.at("class"), BufferClass::comm, path, "class");
          if (op.kind == OpKind::alloc) {
            std::string dtype = jo.at("dtype").get<std::string>();
            std::optional<Dtype> parsed = parse_buffer_dtype(dtype);
            if (!parsed) {
              throw InputError(path + ": key 'dtype' = \"" + dtype +
                               "\": unknown value (valid: fp64, fp32, tf32, bf16, fp16, fp8, int32, int64, u8, "
                               "fp8_e4m3, fp8_e5m2, mxfp8_e4m3, mxfp8_e5m2, fp8_block_e4m3, fp8_block_e5m2, "
                               "fp8_tile_e4m3)");
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
            op.peer = parse_enum(jo.at("peer"), Peer::ps_worker, path, "peer");
            op.tag = int32_t(integer(jo.at("tag"), "tag", -1, kMaxTag));
            op.server = int32_t(integer(jo.value("server", Json(-1)), "server", -1, p.parameter_servers - 1));
            if ((op.peer == Peer::ps_server) != (op.server >= 0)) {
              throw InputError(path + ": op " + std::to_string(op.id) + ": peer " + to_string(op.peer) +
                               (op.server >= 0 ? " with a server" : " without a server") +
                               "; valid: a server (0 … parameter_servers − 1) exactly with peer ps_server");
            }
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
    const std::vector<int64_t> classes = p.class_microbatches();
    const size_t workers = classes.size() * size_t(p.pp_size);
    if (p.roles.size() != workers + size_t(p.parameter_servers)) {
      throw InputError(path + ": key 'roles': " + std::to_string(p.roles.size()) +
                       " roles; valid: one per pipeline stage (" + std::to_string(p.pp_size) + ") of each of the " +
                       std::to_string(classes.size()) +
                       " replica classes (distinct microbatches_per_replica), then one per parameter server (" +
                       std::to_string(p.parameter_servers) + ")");
    }
    for (size_t r = 0; r < p.roles.size(); ++r) {
      const Role& role = p.roles[r];
      const bool server = r >= workers;
      const size_t stage = server ? 0 : r % size_t(p.pp_size);
      const int64_t microbatches = server ? p.num_microbatches : classes[r / size_t(p.pp_size)];
      const int32_t server_index = server ? int32_t(r - workers) : -1;
      if (role.index != int32_t(r) || role.pp_stage != int64_t(stage) || role.num_microbatches != microbatches ||
          role.server != server_index) {
        throw InputError(path + ": role " + std::to_string(r) + ": index " + std::to_string(role.index) +
                         ", pp_stage " + std::to_string(role.pp_stage) + ", num_microbatches " +
                         std::to_string(role.num_microbatches) + ", server " + std::to_string(role.server) +
                         "; valid: index " + std::to_string(r) + ", pp_stage " + std::to_string(stage) +
                         ", num_microbatches " + std::to_string(microbatches) + ", server " +
                         std::to_string(server_index));
      }
    }
    p.program_sha256 = recorded;
    return p;
  } catch (const Json::exception& e) {
    throw InputError(path + ": not a valid stepcast program: " + e.what());
  }
}

}  // namespace stepcast
