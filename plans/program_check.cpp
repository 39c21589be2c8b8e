// The StepProgram invariants of program_check.hpp.
#include "program_check.hpp"

#include "op_signature.hpp"

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <span>
#include <tuple>
#include <set>
#include <sstream>
#include <unordered_map>

namespace stepcast {

namespace {

std::string where(const Role& role, const Op& op) {
  std::ostringstream out;
  out << "role " << role.index << " op " << op.id << " (" << to_string(op.kind);
  if (op.name != OpName::none) out << " " << op.name;
  if (!op.buffer.empty()) out << " " << op.buffer;
  out << ")";
  return out.str();
}

struct Live {
  int32_t alloc_op;
  bool persistent;
  std::vector<int32_t> users;
};

int64_t elements(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The op's operands against its signature: their count, and the dtype and element count of
// every live buffer against its slot's rules.
void check_operands(const Role& role, const Op& op,
                    const std::unordered_map<std::string, Live>& live,
                    std::vector<std::string>& errors) {
  const OpSignature* signature = find_signature(op);
  if (!signature) {
    errors.push_back(where(role, op) + ": no signature for (" + to_string(op.kind) + ", '" +
                     to_string(op.name) + "', '" + to_string(op.grad) + "', " +
                     to_string(op.phase) + ")");
    return;
  }
  SlotBinding binding = bind_slots(*signature, op);
  if (!binding.error.empty()) {
    errors.push_back(where(role, op) + ": " + binding.error);
    return;
  }
  auto alloc_of = [&](const std::string& name) -> const Op* {
    auto it = live.find(name);
    return it == live.end() ? nullptr : &role.ops[size_t(it->second.alloc_op)];
  };
  const Op* first = op.inputs.empty() ? nullptr : alloc_of(op.inputs[0]);
  auto check_side = [&](std::span<const BufferName> names,
                        const std::vector<const Slot*>& slots, const char* side) {
    for (size_t i = 0; i < names.size(); ++i) {
      const Slot& slot = *slots[i];
      const Op* alloc = alloc_of(names[i]);
      if (!alloc) continue;  // reported by check_buffers
      std::string what = where(role, op) + ": " + side + " slot '" + slot.name + "' (buffer '" +
                         names[i] + "')";
      if (!dtype_fits(slot.dtype, alloc->dtype, first ? first->dtype : alloc->dtype)) {
        errors.push_back(what + " is " + to_string(alloc->dtype) + "; its slot takes " +
                         to_string(slot.dtype));
      }
      std::optional<int64_t> want = expected_elements(slot.shape, op);
      if (want && elements(alloc->shape) != *want) {
        errors.push_back(what + " holds " + std::to_string(elements(alloc->shape)) +
                         " elements; its slot takes " + to_string(slot.shape) + " = " +
                         std::to_string(*want));
      }
      if ((slot.role == SlotRole::comm_scratch) != is_comm_scratch(names[i])) {
        errors.push_back(what + (is_comm_scratch(names[i]) ? " is" : " is not") +
                         " comm scratch; its slot's role is " + to_string(slot.role));
      }
    }
  };
  check_side(op.inputs, binding.inputs, "input");
  check_side(op.outputs, binding.outputs, "output");
}

void check_buffers(const Role& role, std::vector<std::string>& errors) {
  std::unordered_map<std::string, Live> live;
  for (size_t i = 0; i < role.ops.size(); ++i) {
    const Op& op = role.ops[i];
    if (op.id != int32_t(i)) errors.push_back(where(role, op) + ": id is not its index");
    for (int32_t d : op.deps) {
      if (d < 0 || d >= op.id) errors.push_back(where(role, op) + ": dep on a later op");
    }
    if (op.kind == OpKind::alloc) {
      if (live.count(op.buffer)) errors.push_back(where(role, op) + ": allocated twice");
      live[op.buffer] = {op.id, op.persistent, {}};
      continue;
    }
    if (op.kind == OpKind::free) {
      auto it = live.find(op.buffer);
      if (it == live.end()) {
        errors.push_back(where(role, op) + ": frees a buffer that is not live");
        continue;
      }
      if (it->second.persistent) errors.push_back(where(role, op) + ": frees a persistent buffer");
      // The free must follow every user of the buffer through its chain of deps.
      std::set<int32_t> pending(it->second.users.begin(), it->second.users.end());
      std::vector<int32_t> stack(op.deps.begin(), op.deps.end());
      std::set<int32_t> seen;
      while (!stack.empty() && !pending.empty()) {
        int32_t d = stack.back();
        stack.pop_back();
        if (d < it->second.alloc_op || !seen.insert(d).second) continue;
        pending.erase(d);
        for (int32_t dd : role.ops[d].deps) stack.push_back(dd);
      }
      if (!pending.empty()) {
        errors.push_back(where(role, op) + ": does not wait for its user op " +
                         std::to_string(*pending.begin()));
      }
      live.erase(it);
      continue;
    }
    auto use = [&](const BufferName& name) {
      auto it = live.find(name);
      if (it == live.end()) {
        errors.push_back(where(role, op) + ": uses buffer '" + name + "' that is not live");
      } else {
        it->second.users.push_back(op.id);
      }
    };
    for (const BufferName& name : op.inputs) use(name);
    for (const BufferName& name : op.outputs) use(name);
    check_operands(role, op, live, errors);
  }
  for (const auto& [name, state] : live) {
    if (!state.persistent) {
      errors.push_back("role " + std::to_string(role.index) + ": buffer '" + name +
                       "' is never freed");
    }
  }
}

bool is_cp_peer(Peer peer) { return peer == Peer::cp_next || peer == Peer::cp_prev; }
bool is_ps_peer(Peer peer) { return peer == Peer::ps_server || peer == Peer::ps_worker; }

// The stage of a peer: a context-parallel ring neighbour holds the same stage.
int64_t peer_stage(const StepProgram& p, int64_t stage, Peer peer) {
  if (is_cp_peer(peer)) return stage;
  return peer == Peer::pp_next ? (stage + 1) % p.pp_size : (stage + p.pp_size - 1) % p.pp_size;
}

// The roles of one replica class, by pipeline stage (every role where the replicas are equal).
using Pipeline = std::vector<const Role*>;

void check_p2p(const StepProgram& p, const Pipeline& pipeline, std::vector<std::string>& errors) {
  // (from, to, on the cp ring) → sequence of (tag, bytes) sent / received, in list order.
  using Link = std::tuple<int64_t, int64_t, bool>;
  std::map<Link, std::vector<std::pair<int64_t, double>>> sent, received;
  for (const Role* each : pipeline) {
    const Role& role = *each;
    for (const Op& op : role.ops) {
      if (is_ps_peer(op.peer)) continue;  // check_parameter_servers
      if (op.kind == OpKind::send) {
        if (op.peer == Peer::cp_prev) errors.push_back("op " + std::to_string(op.id) + ": a send to cp_prev (the ring sends to cp_next)");
        sent[{role.pp_stage, peer_stage(p, role.pp_stage, op.peer), is_cp_peer(op.peer)}].push_back({op.tag, op.bytes});
      } else if (op.kind == OpKind::recv) {
        if (op.peer == Peer::cp_next) errors.push_back("op " + std::to_string(op.id) + ": a receive from cp_next (the ring receives from cp_prev)");
        received[{peer_stage(p, role.pp_stage, op.peer), role.pp_stage, is_cp_peer(op.peer)}].push_back(
            {op.tag, op.bytes});
      }
    }
  }
  for (const auto& [link, sends] : sent) {
    const auto& recvs = received[link];
    std::ostringstream which;
    which << (std::get<2>(link) ? "cp ring of stage " : "stage ") << std::get<0>(link);
    if (!std::get<2>(link)) which << " → " << std::get<1>(link);
    if (sends.size() != recvs.size()) {
      errors.push_back(which.str() + ": " + std::to_string(sends.size()) + " sends but " +
                       std::to_string(recvs.size()) + " receives");
      continue;
    }
    for (size_t i = 0; i < sends.size(); ++i) {
      if (sends[i] != recvs[i]) {
        errors.push_back(which.str() + ": send " + std::to_string(i) + " (tag " +
                         std::to_string(sends[i].first) + ") meets receive with tag " +
                         std::to_string(recvs[i].first) + " or other bytes");
        break;
      }
    }
  }
  for (const auto& [link, recvs] : received) {
    if (!sent.count(link) && !recvs.empty()) {
      errors.push_back("stage " + std::to_string(std::get<1>(link)) + " receives from stage " +
                       std::to_string(std::get<0>(link)) + (std::get<2>(link) ? " on the cp ring" : "") +
                       " which never sends");
    }
  }
}

using CollectiveKey = std::tuple<OpKind, double, Algorithm>;

// Sequence of collectives of each group kind per role.
std::map<GroupKind, std::vector<CollectiveKey>> collectives_of(const Role& role) {
  std::map<GroupKind, std::vector<CollectiveKey>> out;
  for (const Op& op : role.ops) {
    if (is_collective(op.kind)) out[op.group].push_back({op.kind, op.bytes, op.algorithm});
  }
  return out;
}

void check_collectives(const StepProgram& p, const Pipeline& pipeline, std::vector<std::string>& errors) {
  RankGrid grid = p.grid();
  std::vector<std::map<GroupKind, std::vector<CollectiveKey>>> per_role;
  for (const Role* role : pipeline) per_role.push_back(collectives_of(*role));
  // Groups spanning several stages: all member stages must issue identical sequences.
  for (GroupKind kind : {GroupKind::pp, GroupKind::embedding, GroupKind::model, GroupKind::world, GroupKind::instance}) {
    std::vector<int64_t> members = grid.group(kind, 0);
    std::set<int64_t> stages;
    for (int64_t r : members) stages.insert(grid.coord(r).pp);
    const std::vector<CollectiveKey>* first = nullptr;
    int64_t first_stage = -1;
    for (int64_t s : stages) {
      const auto& seq = per_role[size_t(s)][kind];
      if (!first) {
        first = &seq;
        first_stage = s;
      } else if (seq != *first) {
        errors.push_back(std::string("group ") + to_string(kind) + ": stage " +
                         std::to_string(s) + " issues other collectives than stage " +
                         std::to_string(first_stage));
      }
    }
    // Stages outside the group must not issue its collectives.
    for (const Role* role : pipeline) {
      if (!stages.count(role->pp_stage) && !per_role[size_t(role->pp_stage)][kind].empty()) {
        errors.push_back(std::string("group ") + to_string(kind) + ": stage " +
                         std::to_string(role->pp_stage) + " is not a member but issues collectives");
      }
    }
  }
}

// Unequal replicas: groups that span replicas meet in every replica class, so each class's
// stage must issue the same collectives over them as the first class's.
void check_replica_classes(const StepProgram& p, std::vector<std::string>& errors) {
  const size_t pp = size_t(p.pp_size);
  const size_t workers = p.roles.size() - size_t(std::max<int64_t>(0, p.parameter_servers));
  for (size_t r = pp; r < workers; ++r) {
    auto mine = collectives_of(p.roles[r]);
    auto first = collectives_of(p.roles[r % pp]);
    for (GroupKind kind : {GroupKind::dp, GroupKind::dp_cp, GroupKind::dp_shard, GroupKind::dp_replica,
                           GroupKind::world, GroupKind::instance, GroupKind::ep, GroupKind::etp, GroupKind::edp,
                           GroupKind::edp_shard, GroupKind::edp_replica}) {
      if (mine[kind] != first[kind]) {
        errors.push_back(std::string("group ") + to_string(kind) + ": role " + std::to_string(r) + " (stage " +
                         std::to_string(r % pp) + ", " + std::to_string(p.roles[r].num_microbatches) +
                         " microbatches) issues other collectives than role " + std::to_string(r % pp) + " (" +
                         std::to_string(p.roles[r % pp].num_microbatches) + " microbatches), which it meets");
      }
    }
  }
}

// Executes all roles with unit-less progress: an op runs once its deps are done and it heads
// its stream; a send is posted when it runs and completes when its receive runs (an op that
// waits for it, in a plan without overlap_p2p_comm, waits until then; a free goes on once it is
// posted); a receive runs when its send has been posted; a collective of a group spanning
// stages when every member stage has reached it.
void check_progress(const StepProgram& p, const Pipeline& pipeline, std::vector<std::string>& errors,
                    bool list_order) {
  size_t n = pipeline.size();
  std::vector<std::vector<char>> done(n);
  std::vector<std::vector<char>> posted(n);  // per role, per op: a send posted
  std::vector<std::array<std::deque<int32_t>, 3>> queues(n);
  for (size_t r = 0; r < n; ++r) {
    done[r].assign(pipeline[r]->ops.size(), 0);
    posted[r].assign(pipeline[r]->ops.size(), 0);
    for (const Op& op : pipeline[r]->ops) {
      queues[r][list_order ? 0 : size_t(op.stream)].push_back(op.id);
    }
  }
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::pair<size_t, int32_t>> sends_posted;  // (from, to, tag) → op
  std::map<std::pair<GroupKind, size_t>, std::set<size_t>> arrived;  // (group, index) → stages
  std::vector<std::map<GroupKind, size_t>> issued(n);
  bool progress = true;
  while (progress) {
    progress = false;
    for (size_t r = 0; r < n; ++r) {
      const Role& role = *pipeline[r];
      for (auto& queue : queues[r]) {
        while (!queue.empty()) {
          const Op& op = role.ops[queue.front()];
          const bool memory_op = op.kind == OpKind::alloc || op.kind == OpKind::free;
          bool ready = true;
          for (int32_t d : op.deps) ready = ready && (done[r][d] || (memory_op && posted[r][d]));
          if (!ready) break;
          if (op.kind == OpKind::recv && !is_ps_peer(op.peer)) {  // a server's: check_parameter_servers
            int64_t from = peer_stage(p, role.pp_stage, op.peer);
            auto sent = sends_posted.find({from, role.pp_stage, op.tag});
            if (sent == sends_posted.end()) break;
            done[sent->second.first][sent->second.second] = 1;  // the send completes with it
          }
          bool spans = op.group == GroupKind::embedding || op.group == GroupKind::world ||
                       op.group == GroupKind::model || op.group == GroupKind::pp || op.group == GroupKind::instance;
          if (is_collective(op.kind) && spans && p.pp_size > 1) {
            size_t index = issued[r][op.group];
            auto key = std::make_pair(op.group, index);
            arrived[key].insert(r);
            size_t needed = op.group == GroupKind::embedding ? 2 : n;
            if (arrived[key].size() < needed) break;
            ++issued[r][op.group];
          }
          if (op.kind == OpKind::send && !is_ps_peer(op.peer)) {
            sends_posted[{role.pp_stage, peer_stage(p, role.pp_stage, op.peer), op.tag}] = {r, op.id};
            posted[r][op.id] = 1;
          } else {
            done[r][op.id] = 1;
          }
          queue.pop_front();
          progress = true;
        }
      }
    }
  }
  for (size_t r = 0; r < n; ++r) {
    for (const auto& queue : queues[r]) {
      if (!queue.empty()) {
        errors.push_back("deadlock: " + where(*pipeline[r], pipeline[r]->ops[queue.front()]) +
                         " never runs");
        return;
      }
    }
  }
}

// Parameter servers: each server's role receives, in order, what a worker's role sends it (the
// norm, then the gradient's slices) and sends what the worker receives from it (the weights'
// slices), tag for tag and byte for byte; the roles of the workers and servers add up.
void check_parameter_servers(const StepProgram& p, std::vector<std::string>& errors) {
  const size_t workers = p.roles.size() - size_t(std::max<int64_t>(0, p.parameter_servers));
  using Transfers = std::vector<std::pair<int64_t, double>>;
  for (size_t r = 0; r < p.roles.size(); ++r) {
    const Role& role = p.roles[r];
    if ((r >= workers) != (role.server >= 0)) {
      errors.push_back("role " + std::to_string(r) + ": " + (role.server >= 0 ? "a server's role among the workers'"
                                                                               : "a worker's role after the servers'"));
    }
  }
  for (size_t r = workers; r < p.roles.size(); ++r) {
    const Role& server = p.roles[r];
    Transfers received, sent;
    for (const Op& op : server.ops) {
      if (!is_p2p(op.kind)) continue;
      if (op.peer != Peer::ps_worker) {
        errors.push_back(where(server, op) + ": a server's transfer with peer " + to_string(op.peer));
        continue;
      }
      (op.kind == OpKind::recv ? received : sent).push_back({op.tag, op.bytes});
    }
    for (size_t w = 0; w < workers; ++w) {
      Transfers pushed, pulled;
      for (const Op& op : p.roles[w].ops) {
        if (!is_p2p(op.kind) || op.peer != Peer::ps_server || op.server != server.server) continue;
        (op.kind == OpKind::send ? pushed : pulled).push_back({op.tag, op.bytes});
      }
      if (pushed != received || pulled != sent) {
        errors.push_back("role " + std::to_string(w) + " and server " + std::to_string(server.server) + ": the worker sends " +
                         std::to_string(pushed.size()) + " and receives " + std::to_string(pulled.size()) +
                         " transfers where the server receives " + std::to_string(received.size()) + " and sends " +
                         std::to_string(sent.size()) + ", or their tags or bytes differ");
      }
    }
  }
}

// FP8 buffers as the program's recipe stores them (fp8.hpp): MX buffers (codes with a scale per
// 32, in bands of 32 whole rows) exactly under mxfp8, blockwise ones (128-element blocks or tiles,
// bands of 128 rows) exactly under blockwise, per-tensor FP8 codes under the others.
void check_fp8_storage(const StepProgram& program, std::vector<std::string>& errors) {
  for (const Role& role : program.roles) {
    for (const Op& op : role.ops) {
      if (op.kind != OpKind::alloc || !is_fp8_storage(op.dtype)) continue;
      const Fp8Blocks blocks = fp8_blocks(op.dtype);
      // (blockwise: tiles are the layers' weight copies, and only those)
      const bool weights = op.buffer_class == BufferClass::weights;
      const bool stored = program.fp8.mx()          ? blocks == Fp8Blocks::mx
                          : program.fp8.blockwise() ? blocks == (weights ? Fp8Blocks::tile : Fp8Blocks::vector)
                                                    : blocks == Fp8Blocks::none;
      if (!program.fp8.enabled() || !stored) {
        errors.push_back(where(role, op) + ": an FP8 buffer of dtype " + to_string(op.dtype) + " (class " +
                         to_string(op.buffer_class) + ") in a program whose " +
                         (program.fp8.enabled() ? "fp8 recipe is " + std::string(to_string(program.fp8.scaling))
                                                : std::string("plan has no fp8")));
        continue;
      }
      // (A one-dimensional block-scaled buffer is a parameter group's copy: each tensor blocked on its own.)
      const int64_t cols = op.shape.empty() ? 1 : op.shape.back(), block = block_length(blocks);
      if (blocks != Fp8Blocks::none && op.shape.size() > 1 &&
          (cols % block != 0 || (elements(op.shape) / cols) % block != 0)) {
        errors.push_back(where(role, op) + ": a block-scaled buffer (" + to_string(op.dtype) + ") of " +
                         std::to_string(elements(op.shape) / cols) + " rows of " + std::to_string(cols) +
                         ", not multiples of " + std::to_string(block));
      }
    }
  }
}

// The roles of each replica class, by stage (the workers', not the parameter servers').
std::vector<Pipeline> pipelines(const StepProgram& program) {
  std::vector<Pipeline> out;
  const size_t pp = size_t(std::max<int64_t>(1, program.pp_size));
  const size_t workers = program.roles.size() - size_t(std::max<int64_t>(0, program.parameter_servers));
  for (size_t r = 0; r < workers; ++r) {
    if (r % pp == 0) out.emplace_back();
    out.back().push_back(&program.roles[r]);
  }
  return out;
}

}  // namespace

std::vector<std::string> check_program(const StepProgram& program) {
  std::vector<std::string> errors;
  for (const Role& role : program.roles) check_buffers(role, errors);
  const std::vector<Pipeline> classes = pipelines(program);
  for (const Pipeline& pipeline : classes) {
    check_p2p(program, pipeline, errors);
    check_collectives(program, pipeline, errors);
  }
  check_replica_classes(program, errors);
  check_fp8_storage(program, errors);
  if (program.parameter_servers > 0) check_parameter_servers(program, errors);
  for (const Pipeline& pipeline : classes) {
    if (errors.empty()) check_progress(program, pipeline, errors, false);
  }
  return errors;
}

std::vector<std::string> check_list_order_progress(const StepProgram& program) {
  std::vector<std::string> errors;
  for (const Pipeline& pipeline : pipelines(program)) check_progress(program, pipeline, errors, true);
  return errors;
}

}  // namespace stepcast
