// Canonical JSON text of the StepProgram and its SHA-256 (reading it back: program_json_read.cpp).
// The writer streams: a 600k-op program is never held as a JSON tree.
#include "program_json.hpp"

#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <span>
#include <sstream>
#include <unordered_map>

#include "errors.hpp"
#include "op_signature.hpp"
#include "program_json_detail.hpp"
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
  // The buffer itself, to append an op's text to directly; then done_appending().
  std::string& text() { return buffer_; }
  void done_appending() {
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

void put_integer(std::string& s, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  s.append(buf, r.ptr);
}

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

// A name of the program's vocabulary (an enum's or a slot's): nothing in it to escape.
void put_name(std::string& s, const char* name) {
  s += '"';
  s += name;
  s += '"';
}

template <size_t N>
void put_key(std::string& s, const char (&key)[N]) {
  s += ",\"";
  s.append(key, N - 1);
  s += "\":";
}

template <typename Integers>
void put_int_list(std::string& s, const Integers& v) {
  s += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    put_integer(s, int64_t(v[i]));
  }
  s += ']';
}

// find_signature of each (kind, grad, phase, name) met: a walk of the table per op otherwise.
using Signatures = std::unordered_map<uint32_t, const OpSignature*>;

// Operands by slot: [{"slot":NAME,"buffer":NAME,"dtype":DTYPE,"shape":[...]}, ...].
void put_operands(std::string& s, std::span<const BufferName> buffers,
                  const std::vector<const Slot*>& slots, const LiveAllocs& live) {
  s += '[';
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (i) s += ',';
    auto it = live.find(buffers[i]);
    STEPCAST_CHECK(it != live.end(), "program.json: operand '" + buffers[i] + "' is not allocated");
    s += "{\"slot\":";
    put_name(s, slots[i]->name);
    put_key(s, "buffer");
    put_string(s, buffers[i].str());
    put_key(s, "dtype");
    put_name(s, to_string(it->second->dtype));
    put_key(s, "shape");
    put_int_list(s, it->second->shape);
    s += '}';
  }
  s += ']';
}

void put_op(std::string& s, const Op& op, const LiveAllocs& live, Signatures& signatures) {
  s += "{\"id\":";
  put_integer(s, op.id);
  put_key(s, "kind");
  put_name(s, to_string(op.kind));
  put_key(s, "stream");
  put_name(s, to_string(op.stream));
  put_key(s, "phase");
  put_name(s, to_string(op.phase));
  if (op.name != OpName::none) { put_key(s, "name"); put_name(s, to_string(op.name)); }
  if (op.grad != Grad::none) { put_key(s, "grad"); put_name(s, to_string(op.grad)); }
  if (op.layer >= 0) { put_key(s, "layer"); put_integer(s, op.layer); }
  if (op.microbatch >= 0) { put_key(s, "microbatch"); put_integer(s, op.microbatch); }
  if (op.chunk >= 0) { put_key(s, "chunk"); put_integer(s, op.chunk); }
  put_key(s, "deps");
  put_int_list(s, op.deps);
  if (op.kind == OpKind::alloc || op.kind == OpKind::free) {
    put_key(s, "buffer");
    put_string(s, op.buffer.str());
    put_key(s, "class");
    put_name(s, to_string(op.buffer_class));
    put_key(s, "bytes");
    put_number(s, op.bytes);
    if (op.kind == OpKind::alloc) {
      put_key(s, "dtype");
      put_name(s, to_string(op.dtype));
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
    put_key(s, "batch"); put_integer(s, op.batch);
    put_key(s, "m"); put_integer(s, op.m);
    put_key(s, "n"); put_integer(s, op.n);
    put_key(s, "k"); put_integer(s, op.k);
  }
  if (op.cp_step >= 0) { put_key(s, "cp_step"); put_integer(s, op.cp_step); }
  if (op.fp8_slots[0] >= 0) {
    put_key(s, "fp8_slots");
    put_int_list(s, op.fp8_slots);
  }
  if (is_compute(op.kind)) { put_key(s, "flops"); put_number(s, op.flops); }
  put_key(s, "bytes");
  put_number(s, op.bytes);
  if (is_collective(op.kind)) {
    put_key(s, "group");
    put_name(s, to_string(op.group));
    put_key(s, "algorithm");
    put_name(s, to_string(op.algorithm));
  }
  if (is_p2p(op.kind)) {
    put_key(s, "peer");
    put_name(s, to_string(op.peer));
    put_key(s, "tag");
    put_integer(s, op.tag);
    if (op.server >= 0) {  // a worker's transfer with parameter server `server`
      put_key(s, "server");
      put_integer(s, op.server);
    }
    if (op.group == GroupKind::tp) {  // a send of this rank's 1/tp slice (scatter_gather_tensors_in_pipeline)
      put_key(s, "group");
      put_name(s, to_string(op.group));
    }
  }
  s += '}';
}

}  // namespace

std::string write_program_json(const StepProgram& program, std::ostream* out, const ProgramProgress* progress) {
  auto wait_for = [&](size_t roles) {
    if (progress && !progress->wait_for(roles)) throw InputError("the program was not lowered: nothing to write");
  };
  wait_for(0);
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
  if (!program.microbatches_per_replica.empty()) {  // absent: equal replicas
    put_key(s, "microbatches_per_replica");
    put_int_list(s, program.microbatches_per_replica);
  }
  put_key(s, "tokens_per_step");
  put_number(s, double(program.tokens_per_step));
  if (program.async_staleness > 0) {  // absent: synchronous
    put_key(s, "async_staleness");
    put_number(s, double(program.async_staleness));
  }
  if (program.parameter_servers > 0) {  // absent: none
    put_key(s, "parameter_servers");
    put_number(s, double(program.parameter_servers));
  }
  if (program.moe.num_experts > 0) {  // absent: no experts
    Json moe{{"num_experts", program.moe.num_experts},
             {"top_k", program.moe.top_k},
             {"capacity_factor", program.moe.capacity_factor},
             {"routing_shares", program.moe.routing_shares},
             {"routing_seed", program.moe.routing_seed},
             {"routed_tokens", program.moe.routed_tokens},
             {"expert_capacity_rows", program.moe.expert_capacity_rows},
             {"pad_to_capacity", program.moe.pad_to_capacity}};
    // (absent dropless: nothing is dropped; absent under a capacity in programs from before the key)
    if (program.moe.expert_capacity_rows > 0) {
      moe["token_drop_policy"] = program.moe.drop_by_probs ? "probs" : "position";
    }
    // absent: every layer draws from routing_shares
    if (!program.moe.layer_routing_shares.empty()) moe["layer_routing_shares"] = program.moe.layer_routing_shares;
    if (!program.moe.routing_samples.empty()) moe["routing_samples"] = program.moe.routing_samples;  // absent: draws
    s += ",\"moe\":" + moe.dump();
  }
  if (program.fp8.enabled()) {  // absent: no FP8
    s += ",\"fp8\":{\"format\":";
    put_name(s, to_string(program.fp8.format));
    put_key(s, "recipe");
    put_name(s, to_string(program.fp8.scaling));
    put_key(s, "amax_history_len");
    put_number(s, double(program.fp8.amax_history_len));
    put_key(s, "amax_compute_algo");
    put_name(s, to_string(program.fp8.amax_compute_algo));
    put_key(s, "margin");
    put_number(s, double(program.fp8.margin));
    put_key(s, "slots");
    put_number(s, double(program.fp8_slots));
    if (program.fp8.blockwise() && !program.fp8.power_of_two_scales) {  // absent: powers of two
      put_key(s, "block_scales");
      put_name(s, "fp32");
    }
    if (program.fp8.param_gather) s += ",\"param_gather\":true";  // absent: off
    s += '}';
  }
  s += ",\"roles\":[";
  sink.put(s);
  for (size_t r = 0; r < program.roles.size(); ++r) {
    wait_for(r + 1);
    const Role& role = program.roles[r];
    s.clear();
    if (r) s += ',';
    s += "{\"index\":";
    put_number(s, role.index);
    put_key(s, "pp_stage");
    put_number(s, double(role.pp_stage));
    put_key(s, "chunk_virtual_stages");
    put_int_list(s, role.chunks_virtual_stages);
    if (!program.microbatches_per_replica.empty()) {  // absent: the program's num_microbatches
      put_key(s, "num_microbatches");
      put_number(s, double(role.num_microbatches));
    }
    if (role.server >= 0) {  // a parameter server's role
      put_key(s, "server");
      put_number(s, double(role.server));
    }
    s += ",\"ops\":[\n";
    sink.put(s);
    LiveAllocs live;
    Signatures signatures;
    for (size_t i = 0; i < role.ops.size(); ++i) {
      std::string& text = sink.text();
      if (i) text += ",\n";
      track_alloc(live, role.ops[i]);
      put_op(text, role.ops[i], live, signatures);
      sink.done_appending();
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

}  // namespace stepcast
