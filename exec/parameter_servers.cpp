#include "exec/parameter_servers.hpp"

#include <algorithm>
#include <limits>

#include "exec/param_load.hpp"
#include "kernels/transformer.hpp"
#include "model/error.hpp"

namespace hetflow::exec {

using partition::TaskKind;

namespace {

// The layer a slot belongs to.
int layer_of(const ChunkParams& p, const ParamSlot& slot) {
  const auto after = std::upper_bound(p.layer_start.begin(), p.layer_start.end(), slot.offset);
  return p.layer_begin + static_cast<int>(after - p.layer_start.begin()) - 1;
}

// A server holds each parameter whole, in this project's [out, in] layout (row-major
// full_rows x full_cols); a tensor-parallel rank holds the rectangles `slot.pieces` of it.
// What the rank holds of `whole`, appended to `out`:
void append_pieces(const ParamSlot& slot, const std::vector<float>& whole, std::vector<float>& out) {
  for (const Piece& piece : slot.pieces) {
    for (std::int64_t r = piece.row; r < piece.row + piece.rows; ++r) {
      const auto from = whole.begin() + static_cast<std::ptrdiff_t>(r * slot.full_cols + piece.col);
      out.insert(out.end(), from, from + static_cast<std::ptrdiff_t>(piece.cols));
    }
  }
}

// ... and the rank's `shard` added into `whole` where it belongs.
void add_pieces(const ParamSlot& slot, const float* shard, std::vector<float>& whole) {
  for (const Piece& piece : slot.pieces) {
    for (std::int64_t r = piece.row; r < piece.row + piece.rows; ++r) {
      float* to = whole.data() + r * slot.full_cols + piece.col;
      for (std::int64_t c = 0; c < piece.cols; ++c) to[c] += *shard++;
    }
  }
}

}  // namespace

ParameterServers::ParameterServers(const partition::Plan& plan, const DecoderShape& shape,
                                   const std::map<ChunkKey, ChunkParams>& chunks, std::function<bool(int)> local,
                                   std::uint64_t seed, const WeightSource* init, const ResumeFrom* resume)
    : plan_(plan), chunks_(chunks), staleness_(plan.layout.sync.staleness) {
  const std::vector<int>& server_of = plan_.layout.sync.layer_server;
  const std::map<std::string, size_t> by_name =
      init != nullptr ? tensor_index(*init) : std::map<std::string, size_t>{};
  std::map<std::string, size_t> moment_index[2];
  if (resume != nullptr) moment_index[0] = tensor_index(resume->exp_avg), moment_index[1] = tensor_index(resume->exp_avg_sq);
  std::map<std::string, int> server_of_name;
  for (size_t l = 0; l < server_of.size(); ++l) {
    const int layer = static_cast<int>(l);
    const ChunkParams p = chunk_params(shape, layer, layer + 1);
    for (const ParamSlot& slot : p.slots) {
      if (auto other = server_of_name.find(slot.name); other != server_of_name.end() && other->second != server_of[l]) {
        throw PlanError("the tied embedding '" + slot.name + "' is served by devices " + std::to_string(other->second) +
                        " and " + std::to_string(server_of[l]) +
                        ": its two copies would drift apart; give layer 0 and the head one server");
      }
      server_of_name[slot.name] = server_of[l];
    }
    if (!local(server_of[l])) continue;  // another rank's server
    std::vector<float> values(p.count);
    init_params(p, shape, seed, values.data());
    Server& server = servers_[server_of[l]];
    for (const ParamSlot& slot : p.slots) {
      if (server.params.count(slot.name)) continue;  // the head's tied copy: the embedding itself
      Param& sp = server.params[slot.name];
      sp.p.assign(values.begin() + static_cast<std::ptrdiff_t>(slot.offset),
                  values.begin() + static_cast<std::ptrdiff_t>(slot.offset + slot.count));
      if (init != nullptr) {  // (a rank serving layers it runs no chunk of checks them here)
        const size_t t = find_param_tensor(by_name, slot.name);
        if (t == static_cast<size_t>(-1)) {
          throw InputError(init->path(), 0, slot.name, "missing: the model needs this parameter");
        }
        load_param(slot, *init, t, sp.p.data());
      }
      sp.m.assign(slot.count, 0.0f);
      sp.v.assign(slot.count, 0.0f);
      if (resume != nullptr) {  // (the names were checked against the weights' on opening)
        for (const auto& [k, source, into] : {std::tuple{0, &resume->exp_avg, &sp.m}, {1, &resume->exp_avg_sq, &sp.v}}) {
          const size_t t = find_param_tensor(moment_index[k], slot.name);
          if (t == static_cast<size_t>(-1)) throw InputError(source->path(), 0, slot.name, "missing: the model needs this moment");
          load_param(slot, *source, t, into->data());
        }
        sp.steps = static_cast<int>(resume->progress.optimizer_steps);
      }
      sp.g.assign(slot.count, 0.0f);
      sp.decays = slot.decays;
      sp.balancing = slot.balancing;
    }
  }
  // A device's gradients are complete after the compute task its pushes (or its server's
  // update, for a local push) wait for.
  takes_gradients_.assign(plan_.tasks.size(), 0);
  for (const partition::OrderEdge& e : plan_.order) {
    const partition::Task& to = plan_.task(e.to);
    const bool push = to.kind == TaskKind::send && to.purpose == partition::Purpose::ps_push;
    const bool update = to.kind == TaskKind::optimizer && to.worker < 0;
    if (!(push || update) || e.offset != 0 || plan_.task(e.from).kind == TaskKind::recv) continue;
    // (Tensor-parallel collectives run inside the backward: it is the device's last compute.)
    const TaskKind from = plan_.task(e.from).kind;
    if (from != TaskKind::backward && from != TaskKind::backward_weight) {
      throw PlanError("task " + std::to_string(e.from) + " ends a device's gradients but is not a backward task");
    }
    takes_gradients_[static_cast<size_t>(e.from)] = 1;
  }
  for (size_t t = 0; t < plan_.tasks.size(); ++t) {
    const partition::Task& task = plan_.tasks[t];
    if (task.kind == TaskKind::recv && task.purpose == partition::Purpose::ps_push) {
      const int from = plan_.channel(task.channel).src;
      for (const int w : plan_.writes(static_cast<int>(t))) push_source_[w] = {task.worker, task.stage, from};
    }
  }
}

std::vector<const ParamSlot*> ParameterServers::served_slots(const ChunkParams& p, int server) const {
  std::vector<const ParamSlot*> out;
  for (const ParamSlot& slot : p.slots) {
    if (plan_.layout.sync.layer_server[static_cast<size_t>(layer_of(p, slot))] == server) out.push_back(&slot);
  }
  return out;
}

const ChunkParams& ParameterServers::chunk(const ChunkKey& key, int task) const {
  const auto found = chunks_.find(key);
  if (found == chunks_.end()) throw PlanError("transfer task " + std::to_string(task) + " serves no chunk");
  return found->second;
}

const std::vector<float>& ParameterServers::gradients_of(const ChunkKey& c, int iteration) const {
  const auto found = taken_.find({c, iteration});
  if (found == taken_.end()) {
    throw PlanError("the gradients of worker " + std::to_string(std::get<1>(c)) + " stage " +
                    std::to_string(std::get<2>(c)) + " for iteration " + std::to_string(iteration) +
                    " are not complete (a push before the last backward?)");
  }
  return found->second;
}

const std::map<std::string, std::vector<float>>& ParameterServers::weights_of(int server, int iteration) const {
  const auto s = servers_.find(server);
  const auto found = s == servers_.end() ? decltype(s->second.versions)::const_iterator{} : s->second.versions.find(iteration);
  if (s == servers_.end() || found == s->second.versions.end()) {
    throw PlanError("device " + std::to_string(server) + " has no weights of iteration " + std::to_string(iteration) +
                    " (a pull before its server's update?)");
  }
  return found->second;
}

void ParameterServers::take(const ChunkKey& c, int iteration, std::vector<float> grads) {
  std::lock_guard lock(mutex_);
  taken_[{c, iteration}] = std::move(grads);
  // Pushes and updates of iterations this far back are done (WSP bounds the lag).
  const auto first = taken_.lower_bound({c, std::numeric_limits<int>::min()});
  taken_.erase(first, taken_.lower_bound({c, iteration - staleness_ - 3}));
}

std::optional<size_t> ParameterServers::pushed_floats(int tensor) const {
  const auto source = push_source_.find(tensor);
  if (source == push_source_.end()) return std::nullopt;
  const auto [worker, stage, device] = source->second;
  const auto p = chunks_.find({device, worker, stage});
  if (p == chunks_.end()) return std::nullopt;
  size_t floats = 0;
  for (const ParamSlot* slot : served_slots(p->second, plan_.tensor(tensor).device)) floats += slot->count;
  return floats;
}

bool ParameterServers::is_push_or_pull(const partition::Task& t) const {
  return t.kind == TaskKind::send && (t.purpose == partition::Purpose::ps_push || t.purpose == partition::Purpose::ps_pull);
}

std::optional<size_t> ParameterServers::message_floats(int send_task) const {
  const partition::Task& t = plan_.task(send_task);
  if (!is_push_or_pull(t)) return std::nullopt;
  const partition::Channel& channel = plan_.channel(t.channel);
  const bool push = t.purpose == partition::Purpose::ps_push;
  size_t floats = 0;
  for (const ParamSlot* slot : served_slots(chunk({push ? channel.src : channel.dst, t.worker, t.stage}, send_task),
                                            push ? channel.dst : channel.src)) {
    floats += slot->count;
  }
  return floats;
}

std::optional<std::vector<float>> ParameterServers::message(int send_task, int iteration) const {
  const partition::Task& t = plan_.task(send_task);
  if (!is_push_or_pull(t)) return std::nullopt;
  const partition::Channel& channel = plan_.channel(t.channel);
  const bool push = t.purpose == partition::Purpose::ps_push;
  // The chunk's layout (on another rank, for a pull: the server only needs its slots).
  const ChunkKey key{push ? channel.src : channel.dst, t.worker, t.stage};
  const ChunkParams& p = chunk(key, send_task);
  std::vector<float> out;
  std::lock_guard lock(mutex_);
  if (push) {
    const std::vector<float>& grads = gradients_of(key, iteration);
    for (const ParamSlot* slot : served_slots(p, channel.dst)) {
      out.insert(out.end(), grads.begin() + static_cast<std::ptrdiff_t>(slot->offset),
                 grads.begin() + static_cast<std::ptrdiff_t>(slot->offset + slot->count));
    }
  } else {
    const auto& version = weights_of(channel.src, iteration);
    for (const ParamSlot* slot : served_slots(p, channel.src)) append_pieces(*slot, version.at(slot->name), out);
  }
  return out;
}

void ParameterServers::pulled(int recv_task, int iteration, std::span<const float> data) {
  const partition::Task& t = plan_.task(recv_task);
  const ChunkKey key{t.device, t.worker, t.stage};
  if (!chunks_.count(key)) throw PlanError("pull task " + std::to_string(recv_task) + " serves no chunk");
  std::lock_guard lock(mutex_);
  pulled_[{key, iteration, plan_.channel(t.channel).src}].assign(data.begin(), data.end());
}

void ParameterServers::adopt(const ChunkKey& key, int iteration,
                             const std::function<void(const ParamSlot&, std::span<const float>)>& upload) {
  std::lock_guard lock(mutex_);
  const ChunkParams& p = chunks_.at(key);
  std::map<int, bool> servers;
  for (const ParamSlot& slot : p.slots) servers[plan_.layout.sync.layer_server[static_cast<size_t>(layer_of(p, slot))]] = true;
  for (const auto& [server, unused] : servers) {
    const auto slots = served_slots(p, server);
    if (server == std::get<0>(key)) {  // a local pull: the server's weights of that iteration
      const auto& version = weights_of(server, iteration);
      std::vector<float> mine;
      for (const ParamSlot* slot : slots) {
        mine.clear();
        append_pieces(*slot, version.at(slot->name), mine);
        upload(*slot, mine);
      }
      continue;
    }
    const auto found = pulled_.find({key, iteration, server});
    if (found == pulled_.end()) {
      throw PlanError("the chunk of worker " + std::to_string(std::get<1>(key)) + " stage " +
                      std::to_string(std::get<2>(key)) + " starts iteration " + std::to_string(iteration + staleness_ + 1) +
                      " without the pull of iteration " + std::to_string(iteration) + " from device " +
                      std::to_string(server));
    }
    size_t at = 0;
    for (const ParamSlot* slot : slots) {
      upload(*slot, std::span<const float>(found->second).subspan(at, slot->count));
      at += slot->count;
    }
    pulled_.erase(found);
  }
}

void ParameterServers::update(TaskContext& task, const std::atomic<bool>& stop, OptimizerStep& step, GlobalNorm& norm,
                              StepLog& log) {
  const int server = task.spec->device;
  Server& s = servers_.at(server);
  const auto reads = plan_.reads(task.task);
  // Every (worker, chunk, tensor-parallel rank) that pushes here, in that order: a fixed order
  // of sums. A rank adds the pieces it holds of a split parameter; a parameter every rank
  // holds whole (norms, biases after a row-parallel layer) has the same gradients on each,
  // so rank 0's alone count, as the all-reduce path's optimizer counts them.
  for (size_t w = 0; w < plan_.layout.workers.size(); ++w) {
    const partition::VirtualWorker& vw = plan_.layout.workers[w];
    for (size_t k = 0; k < vw.stages.size(); ++k) {
      for (const int device : vw.ranks[static_cast<size_t>(vw.stages[k].rank)]) {
        const std::tuple<int, int, int> source{static_cast<int>(w), static_cast<int>(k), device};
        const ChunkKey key{device, static_cast<int>(w), static_cast<int>(k)};
        const auto found = chunks_.find(key);
        if (found == chunks_.end()) continue;
        const auto slots = served_slots(found->second, server);
        if (slots.empty()) continue;
        std::vector<float> local;
        const float* data = nullptr;
        if (device == server) {
          std::lock_guard lock(mutex_);
          const std::vector<float>& grads = gradients_of(key, task.iteration);
          for (const ParamSlot* slot : slots) {
            local.insert(local.end(), grads.begin() + static_cast<std::ptrdiff_t>(slot->offset),
                         grads.begin() + static_cast<std::ptrdiff_t>(slot->offset + slot->count));
          }
          data = local.data();
        } else {
          size_t floats = 0, expected = 0;
          for (size_t i = 0; i < reads.size(); ++i) {
            const auto pushed = push_source_.find(reads[i]);
            if (pushed != push_source_.end() && pushed->second == source) {
              data = reinterpret_cast<const float*>(task.reads[i].data);
              floats = task.reads[i].size_bytes / sizeof(float);
            }
          }
          for (const ParamSlot* slot : slots) expected += slot->count;
          if (data == nullptr || floats < expected) {
            throw PlanError("the update on device " + std::to_string(server) + " reads " +
                            (data == nullptr ? std::string("no push") : "a push of " + std::to_string(floats) + " floats") +
                            " from worker " + std::to_string(w) + " stage " + std::to_string(k) + " device " +
                            std::to_string(device) + ", whose gradients are " + std::to_string(expected) + " floats");
          }
        }
        const int tp_rank = found->second.tp_rank;
        for (const ParamSlot* slot : slots) {
          Param& sp = s.params.at(slot->name);
          if (slot->split || tp_rank == 0) add_pieces(*slot, data, sp.g);
          data += slot->count;
        }
      }
    }
  }
  OptimizerStep::Verdict verdict;
  const double loss_scale = step.scale_of(task.iteration);
  if (step.needs_norm()) {
    double local = 0;
    for (const auto& [name, sp] : s.params) {
      if (sp.balancing) continue;  // (its gradient counts tokens)
      for (const float g : sp.g) local += static_cast<double>(g) * g;
    }
    if (loss_scale != 1) local /= loss_scale * loss_scale;  // the unscaled gradients' (exact)
    verdict = step.judge(task.iteration, norm.meet(task, stop, server, local));
    if (verdict.skip) log.add_skipped(task.iteration);
  }
  std::map<std::string, std::vector<float>> version;
  for (auto& [name, sp] : s.params) {
    if (sp.balancing) {
      // By the signs of the loads, skipped step or not (Training::step_balancing says why).
      step.balance_host(sp.p.data(), sp.g.data(), sp.p.size());
      if (!verdict.skip) ++sp.steps;
    } else if (!verdict.skip) {  // a skipped step (gradients not finite) leaves the weights as they were
      if (loss_scale != 1) kernels::scale(sp.g.data(), static_cast<float>(1 / loss_scale), static_cast<long>(sp.g.size()));
      if (verdict.clip != 1) kernels::scale(sp.g.data(), verdict.clip, static_cast<long>(sp.g.size()));
      const double lr = step.lr(sp.steps);  // steps taken before this one
      step.adamw_host(sp.p.data(), sp.g.data(), sp.m.data(), sp.v.data(), sp.p.size(), lr, sp.decays, ++sp.steps);
    }
    std::fill(sp.g.begin(), sp.g.end(), 0.0f);
    version[name] = sp.p;
  }
  std::lock_guard lock(mutex_);
  s.versions[task.iteration] = std::move(version);
  s.versions.erase(s.versions.begin(), s.versions.lower_bound(task.iteration - staleness_ - 3));
}

namespace {
const std::vector<float>& array_of(const std::vector<float>& p, const std::vector<float>& m, const std::vector<float>& v,
                                   int array) {
  return array == 1 ? m : array == 2 ? v : p;
}
}  // namespace

std::map<std::string, const float*> ParameterServers::weights(int array) const {
  std::lock_guard lock(mutex_);
  std::map<std::string, const float*> out;
  for (const auto& [device, server] : servers_) {
    for (const auto& [name, p] : server.params) out[name] = array_of(p.p, p.m, p.v, array).data();
  }
  for (const auto& [name, values] : remote_[array]) out[name] = values.data();
  return out;
}

void ParameterServers::save(std::vector<std::byte>& out, bool moments) const {
  std::lock_guard lock(mutex_);
  size_t count = 0;
  for (const auto& [device, server] : servers_) count += server.params.size();
  const int arrays = moments ? 3 : 1;
  put(out, static_cast<std::uint64_t>(count));
  put(out, arrays);
  for (const auto& [device, server] : servers_) {
    for (const auto& [name, p] : server.params) {
      put_string(out, name);
      for (int k = 0; k < arrays; ++k) {
        put_counted(out, std::span<const float>(array_of(p.p, p.m, p.v, k)));
      }
    }
  }
}

void ParameterServers::merge(ByteReader& in) {
  std::lock_guard lock(mutex_);
  const auto count = in.get<std::uint64_t>();
  const int arrays = in.get<int>();
  if (arrays != 1 && arrays != 3) throw Error("a rank sent its servers' state in " + std::to_string(arrays) + " arrays");
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::string name = in.get_string();
    for (int k = 0; k < arrays; ++k) {
      auto& values = remote_[k][name];
      values.resize(static_cast<size_t>(in.get<std::uint64_t>()));
      in.get_into(std::span<float>(values));
    }
  }
}

}  // namespace hetflow::exec
