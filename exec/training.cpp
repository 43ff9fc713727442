// exec::Training as the back ends call it: a task's compute (a chunk's forward or backward,
// the optimizer), what a collective reduces, what a transfer carries.
#include "exec/training.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>

#include "exec/plan_tensors.hpp"
#include "kernels/transformer.hpp"
#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/task_order.hpp"

namespace hetflow::exec {

namespace {

int index_of(std::span<const int> ids, int tensor) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == tensor) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

using partition::CollectiveKind;
using partition::TaskKind;
using partition::TensorKind;
using Floats = std::vector<float>;

Training::~Training() = default;

bool Training::tensor_parallel() const {
  return std::any_of(tp_position_.begin(), tp_position_.end(), [](const auto& p) { return p.second.second > 1; });
}

bool Training::local(int device) const {
  return ranks_ == nullptr || ranks_->owner(device, plan_.device_count()) == ranks_->rank();
}

size_t Training::buffer_bytes(int tensor) const {
  const partition::Tensor& t = plan_.tensor(tensor);
  if (t.kind == TensorKind::pushed_grad) {
    // What the pushing chunk really sends its server: under tensor parallelism a rank's
    // replicated parameters (norms, some biases) whole, where the plan counts 1/t of them.
    if (servers_) {
      if (const auto floats = servers_->pushed_floats(tensor)) return *floats * sizeof(float);
    }
    return t.shape.empty() ? 0 : static_cast<size_t>(t.shape[0]) * sizeof(float);
  }
  if (t.kind != TensorKind::activation && t.kind != TensorKind::activation_grad && t.kind != TensorKind::partial_sum) {
    return 0;
  }
  const auto whole = static_cast<size_t>(plan_.layout.micro_batch_size) * static_cast<size_t>(shape_.S) *
                     static_cast<size_t>(shape_.C);
  const auto [begin, end] = slice_of(tensor, whole);
  return (end - begin) * sizeof(float);
}

// A boundary tensor that arrives in 1/t slices (tensor parallelism) holds this part of the
// whole activation: the all-gather's piece for the device's rank, [at(j/t), at((j+1)/t)) as
// the CPU back end cuts a buffer. Any other tensor holds all of it.
std::pair<size_t, size_t> Training::slice_of(int tensor, size_t whole) const {
  const partition::Tensor& t = plan_.tensor(tensor);
  const auto found = tp_position_.find(t.device);
  if (found == tp_position_.end() || found->second.second < 2 || t.kind == TensorKind::partial_sum) return {0, whole};
  const int j = found->second.first, n = found->second.second;  // (not a structured binding: lambdas capture it)
  const double plan_whole = static_cast<double>(whole) * model::element_bytes(plan_.layout.precision);
  if (std::abs(t.bytes - plan_whole / n) >= std::abs(t.bytes - plan_whole)) return {0, whole};
  const auto at = [&](int k) {
    return std::min(whole, static_cast<size_t>(std::llround(static_cast<double>(k) / n * static_cast<double>(whole))));
  };
  return {at(j), at(j + 1)};
}

void Training::load_micro_batch(TaskContext& task) {
  feed_->load(task.iteration, task.spec->worker, task.spec->microbatch);
}

namespace {

// A chunk's tensor-parallel group as the decoder math sees it: the back end's exchange, for
// this task. Each exchange is the task's next in-task collective message in the plan
// (Plan::inside), of its kind and size, on its communicator; a pass that exchanges what the
// plan does not list, or not all it lists (done()), is the plan's error.
class Group final : public TensorParallelGroup {
 public:
  Group(TensorParallelExchange* exchange, TaskContext& task, const partition::Plan& plan)
      : exchange_(exchange), task_(task), plan_(plan), calls_(plan.inside(task.task)),
        element_bytes_(model::element_bytes(plan.layout.precision)) {}
  void all_reduce(std::span<float> data, bool max) override {
    exchange().all_reduce(task_, next(CollectiveKind::all_reduce, data.size()), data, max);
  }
  void all_gather(std::span<float> data, std::span<const size_t> parts) override {
    exchange().all_gather(task_, next(CollectiveKind::all_gather, data.size()), data, parts);
  }
  void reduce_scatter(std::span<float> data, std::span<const size_t> parts) override {
    exchange().reduce_scatter(task_, next(CollectiveKind::reduce_scatter, data.size()), data, parts);
  }
  // (An all-to-all carries what the router chose: the plan's bytes are its routing model's.)
  std::vector<float> all_to_all(std::span<const float> send, std::span<const size_t> send_parts,
                                std::vector<size_t>& recv_parts) override {
    return exchange().all_to_all(task_, next(CollectiveKind::all_to_all, 0), send, send_parts, recv_parts);
  }
  void send_recv(std::span<const float> send, std::span<float> receive, const std::function<void()>& meanwhile) override {
    exchange().send_recv(task_, next(CollectiveKind::sendrecv, send.size()), send, receive, meanwhile);
  }
  // After the pass: every message the plan lists was exchanged.
  void done() const {
    if (next_ != calls_.size()) {
      throw PlanError(partition::describe_task(plan_, task_.task) + ": the plan lists " + std::to_string(calls_.size()) +
                      " tensor-parallel collective messages inside it; the pass exchanged " + std::to_string(next_));
    }
  }

 private:
  TensorParallelExchange& exchange() const {
    if (exchange_ == nullptr) throw PlanError("a tensor-parallel chunk needs a back end that exchanges between ranks");
    return *exchange_;
  }
  // The communicator of the plan's next message, which must be a `kind` of `floats`.
  int next(CollectiveKind kind, size_t floats) {
    const std::string what = std::string(partition::to_string(kind)) + " of " + std::to_string(floats) + " floats";
    if (next_ >= calls_.size()) {
      throw PlanError(partition::describe_task(plan_, task_.task) + ": its pass exchanges a tensor-parallel " + what +
                      " (message " + std::to_string(next_ + 1) + "), but the plan lists " + std::to_string(calls_.size()) +
                      " inside it");
    }
    const partition::InTaskCall& call = calls_[next_++];
    const partition::Collective& c = plan_.collective(call.collective);
    const double bytes = c.bytes / c.messages, moved = static_cast<double>(floats) * element_bytes_;
    const bool sized = kind != CollectiveKind::all_to_all;
    if (c.kind != kind || (sized && std::abs(bytes - moved) > 1e-9 * std::max(bytes, moved))) {
      throw PlanError(partition::describe_task(plan_, task_.task) + ": its pass exchanges a tensor-parallel " + what +
                      " (" + model::units::format_number(moved) + " bytes) where the plan lists message " +
                      std::to_string(call.message + 1) + " of collective " + std::to_string(call.collective) + ", a " +
                      std::string(partition::to_string(c.kind)) + " of " + model::units::format_number(bytes) + " bytes");
    }
    return c.communicator;
  }

  TensorParallelExchange* exchange_;
  TaskContext& task_;
  const partition::Plan& plan_;
  std::span<const partition::InTaskCall> calls_;
  size_t next_ = 0;
  double element_bytes_;
};

}  // namespace

std::vector<float> TensorParallelExchange::all_to_all(TaskContext& task, int, std::span<const float>,
                                                      std::span<const size_t>, std::vector<size_t>&) {
  throw PlanError("task " + std::to_string(task.task) +
                  ": this back end does not exchange expert-parallel all-to-alls with real math");
}

void TensorParallelExchange::send_recv(TaskContext& task, int, std::span<const float>, std::span<float>,
                                       const std::function<void()>&) {
  throw PlanError("task " + std::to_string(task.task) + ": this back end does not pass blocks around a ring with real math");
}

void Training::compute(TaskContext& task, const std::atomic<bool>& stop, TensorParallelExchange* exchange) {
  const partition::Task& t = *task.spec;
  if (t.kind == TaskKind::optimizer || t.kind == TaskKind::host_optimizer) {
    if (parameter_server_) {
      servers_->update(task, stop, *step_, *norm_, *log_);
    } else {
      optimizer(task, stop);
    }
    return;
  }
  const auto found = chunk_at_.find({t.device, t.worker, t.stage});
  if (found == chunk_at_.end()) throw PlanError("task " + std::to_string(task.task) + " computes no chunk this plan holds");
  Chunk& c = *found->second;
  if (t.kind == TaskKind::forward && servers_ && t.microbatch == 0 && task.iteration > servers_->staleness()) {
    adopt_pulled(c, task.iteration - servers_->staleness() - 1);
  }
  if (t.kind == TaskKind::forward) {
    forward(task, c, exchange);
  } else if (t.kind == TaskKind::backward) {
    backward(task, c, c.split, exchange);  // split: W adds the weights' gradients
  } else {
    DecoderChunk::StashPtr stash;
    {
      std::lock_guard lock(c.mutex);
      auto s = c.stashes.find({task.iteration, t.microbatch});
      if (s == c.stashes.end()) throw PlanError("W task " + std::to_string(task.task) + " runs before its B");
      if (DecoderChunk::stash_on_host(*s->second)) {
        throw PlanError("W task " + std::to_string(task.task) + " runs before its stash's to_device copy");
      }
      stash = std::move(s->second);
      c.stashes.erase(s);
    }
    c.math.backward_weight(*stash, sync_->pass_grads(task, c));
  }
  sync_->pass_done(task);
  if (servers_ && servers_->takes_gradients(task.task)) take_gradients(t.device, task.iteration);
}

void Training::forward(TaskContext& task, Chunk& c, TensorParallelExchange* exchange) {
  const partition::Task& t = *task.spec;
  const ChunkParams& p = c.math.params();
  const int mbs = plan_.layout.micro_batch_size, T = shape_.S;
  const auto reads = plan_.reads(task.task);
  const auto writes = plan_.writes(task.task);
  DecoderChunk::Input in;
  in.samples = mbs;
  // Only the ends read the micro-batch: the first chunk its tokens, the last its targets.
  const auto b = p.has_embedding || p.has_head ? feed_->get(task.iteration, t.worker, t.microbatch) : nullptr;
  if (p.has_embedding) in.tokens = b->inputs.data();
  if (p.has_head) in.targets = b->targets.data();
  // Each token's weight in the objective: the head's loss, and every chunk's load-balancing
  // losses. (A power-of-two loss scale multiplies exactly: the gradients are S times the unscaled.)
  in.loss_scale = static_cast<float>(step_->scale_of(task.iteration) / (static_cast<double>(feed_->global_batch()) * T));
  if (!p.has_embedding) {
    const int i = index_of(reads, tensor_of_kind(plan_, reads, TensorKind::activation));
    if (i < 0) throw PlanError("forward task " + std::to_string(task.task) + " of a middle chunk reads no activation");
    in.input = reinterpret_cast<const float*>(task.reads[static_cast<size_t>(i)].data);
  }
  if (!p.has_head) {
    // Under tensor parallelism the output is this rank's partial sum, which the plan's
    // all-reduce adds up.
    int i = index_of(writes, tensor_of_kind(plan_, writes, TensorKind::partial_sum));
    in.output_partial = i >= 0;
    if (i < 0) i = index_of(writes, tensor_of_kind(plan_, writes, TensorKind::activation));
    // (A tensor-parallel rank whose output no rank of the next stage receives, which has it
    // whole like the others, writes none.)
    if (i < 0 && c.tp == 1) throw PlanError("forward task " + std::to_string(task.task) + " before the head writes no activation");
    if (i >= 0) in.output = reinterpret_cast<float*>(task.writes[static_cast<size_t>(i)].data);
  }
  Group group(exchange, task, plan_);
  if (c.tp > 1) in.group = &group;
  if (c.math.context().size > 1) in.context_group = &group;  // (its exchanges come in the plan's order too)
  if (c.math.experts().size > 1) in.expert_group = &group;
  double loss = 0;
  auto stash = c.math.forward(sync_->pass_params(task, c), in, loss);
  group.done();
  if (const auto [sum, layers] = DecoderChunk::balance_loss(*stash); layers > 0 && c.tp_rank == 0) {
    log_->add_balance(task.iteration, t.worker, t.stage, t.microbatch, sum, layers);
  }
  {
    std::lock_guard lock(c.mutex);
    c.stashes[{task.iteration, t.microbatch}] = std::move(stash);
  }
  if (p.has_head && c.worker >= 0 && c.tp_rank == 0) {  // every rank has the loss: count it once
    log_->add_loss(task.iteration, c.worker, t.microbatch, loss);
  }
}

void Training::copy_stash(TaskContext& task) {
  const partition::Task& t = *task.spec;
  if (t.stage < 0) return;
  const auto found = chunk_at_.find({t.device, t.worker, t.stage});
  if (found == chunk_at_.end()) throw PlanError("task " + std::to_string(task.task) + " copies no chunk this plan holds");
  Chunk& c = *found->second;
  std::lock_guard lock(c.mutex);
  auto s = c.stashes.find({task.iteration, t.microbatch});
  const bool out = t.kind == TaskKind::to_host;
  if (s == c.stashes.end() || DecoderChunk::stash_on_host(*s->second) == out) {
    throw PlanError(std::string(to_string(t.kind)) + " task " + std::to_string(task.task) +
                    (out ? " finds no stash on its device: it runs before its F, or twice"
                         : " finds no stash in host memory: it runs before its to_host, or after its B"));
  }
  if (out) {
    DecoderChunk::stash_to_host(*s->second, c.ops());
  } else {
    DecoderChunk::stash_to_device(*s->second, c.ops());
  }
}

void Training::backward(TaskContext& task, Chunk& c, bool split, TensorParallelExchange* exchange) {
  const partition::Task& t = *task.spec;
  const ChunkParams& p = c.math.params();
  const auto reads = plan_.reads(task.task);
  const auto writes = plan_.writes(task.task);
  const float* dout = nullptr;
  float* dinput = nullptr;
  if (!p.has_head) {
    const int i = index_of(reads, tensor_of_kind(plan_, reads, TensorKind::activation_grad));
    if (i < 0) throw PlanError("backward task " + std::to_string(task.task) + " reads no output gradient");
    dout = reinterpret_cast<const float*>(task.reads[static_cast<size_t>(i)].data);
  }
  bool partial = false;
  if (!p.has_embedding) {
    int i = index_of(writes, tensor_of_kind(plan_, writes, TensorKind::partial_sum));
    partial = i >= 0;
    if (i < 0) i = index_of(writes, tensor_of_kind(plan_, writes, TensorKind::activation_grad));
    // (A tensor-parallel rank whose input gradient no rank of the previous stage receives,
    // which has it whole like the others, writes none.)
    if (i < 0 && c.tp == 1) throw PlanError("backward task " + std::to_string(task.task) + " writes no input gradient");
    if (i >= 0) dinput = reinterpret_cast<float*>(task.writes[static_cast<size_t>(i)].data);
  }
  Group group(exchange, task, plan_);
  TensorParallelGroup* tp = c.tp > 1 ? &group : nullptr;
  TensorParallelGroup* context = c.math.context().size > 1 ? &group : nullptr;
  TensorParallelGroup* experts = c.math.experts().size > 1 ? &group : nullptr;
  DecoderChunk::StashPtr stash;
  {
    std::lock_guard lock(c.mutex);
    auto s = c.stashes.find({task.iteration, t.microbatch});
    if (s == c.stashes.end()) throw PlanError("B task " + std::to_string(task.task) + " runs before its F");
    if (DecoderChunk::stash_on_host(*s->second)) {
      throw PlanError("B task " + std::to_string(task.task) + " runs before its stash's to_device copy");
    }
    if (split) {
      c.math.backward(*s->second, sync_->pass_params(task, c), sync_->pass_grads(task, c), dout, dinput, true, partial, tp,
                      last_backward_[static_cast<size_t>(task.task)] != 0, context, experts);
      group.done();
      return;  // W takes the stash
    }
    stash = std::move(s->second);
    c.stashes.erase(s);
  }
  c.math.backward(*stash, sync_->pass_params(task, c), sync_->pass_grads(task, c), dout, dinput, false, partial, tp,
                  last_backward_[static_cast<size_t>(task.task)] != 0, context, experts);
  group.done();
}

std::span<float> Training::collective_data(const TaskContext& task) {
  if (norm_task_[static_cast<size_t>(task.task)]) {  // the norm's all-reduce: this device's part in, the worker's out
    const OpsFloats& slot = norm_square_[static_cast<size_t>(task.spec->device)];
    const float square = static_cast<float>(local_sum_squares(task.spec->device, task.iteration));
    ops_of_(task.spec->device).upload(slot.data(), &square, 1);
    return slot.span();
  }
  return sync_->data(task);
}

void Training::collective_done(const TaskContext& task) { sync_->done(task); }

std::string Training::describe() const {
  std::ostringstream out;
  out << (shape_.family == DecoderFamily::gpt2 ? "GPT-2" : "LLaMA") << " style, " << shape_.layers << " layers, hidden "
      << shape_.C << ", " << shape_.NH << " heads";
  if (shape_.NH * shape_.HS != shape_.C) out << " of " << shape_.HS;
  if (shape_.NKV != shape_.NH) out << " (" << shape_.NKV << " key/value)";
  if (shape_.qk_norm) out << ", QK-norm";
  out << ", MLP " << shape_.F;
  if (const DecoderShape::Moe& m = shape_.moe; m.E > 0) {
    out << (m.first_dense > 0 || m.every > 1 ? " or " : " replaced by ") << m.E << " experts (top " << m.K;
    if (m.sigmoid) {
      out << " by sigmoid score and balancing bias";
      if (m.groups_chosen < m.groups) out << " in the best " << m.groups_chosen << " of " << m.groups << " groups";
    }
    out << (m.normalize ? (m.sigmoid ? ", renormalised" : " renormalised") : "");
    if (m.scale != 1) out << ", x" << model::units::format_number(m.scale);
    out << ", " << m.FE << " wide)";
    if (m.FS > 0) out << " and a shared one " << m.FS << " wide" << (m.shared_gate ? ", gated" : "");
    if (m.aux_coef > 0) {
      out << ", load-balancing loss x" << model::units::format_number(m.aux_coef) << (m.per_sequence ? " per sequence" : "");
    }
    if (m.sigmoid) {
      out << ", bias step " << model::units::format_number(optimizer_options_.moe_router_bias_update_rate);
    }
  }
  out << ", vocabulary " << shape_.V << ", sequence " << shape_.S;
  if (shape_.qkv_bias) out << (shape_.out_bias ? ", q/k/v/o biases" : ", q/k/v biases");
  if (shape_.window > 0) out << ", sliding window " << shape_.window;
  using Scaling = kernels::RopeFrequencies::Scaling;
  const kernels::RopeFrequencies& r = shape_.rope;
  if (shape_.family == DecoderFamily::llama) {
    out << ", RoPE theta " << model::units::format_number(r.theta);
    if (r.scaling != Scaling::none) {
      out << (r.scaling == Scaling::linear ? " linear" : r.scaling == Scaling::llama3 ? " llama3" : " yarn") << " x"
          << model::units::format_number(r.factor);
    }
    if (r.attention_factor != 1) {
      char scale[32];
      std::snprintf(scale, sizeof scale, "%.4g", r.attention_factor);
      out << " (cos and sin x" << scale << ")";
    }
    if (r.rotary_dims > 0) out << " on " << r.rotary_dims << " of " << shape_.HS << " values a head";
  }
  return out.str();
}

bool Training::receive(const TaskContext& task, std::span<const float> data) {
  const partition::Task& t = *task.spec;
  if (t.purpose == partition::Purpose::activation || t.purpose == partition::Purpose::gradient) {
    // The sender's whole activation; a 1/t slice keeps its part for the all-gather.
    const auto writes = plan_.writes(task.task);
    const auto whole = static_cast<size_t>(plan_.layout.micro_batch_size) * static_cast<size_t>(shape_.S) *
                       static_cast<size_t>(shape_.C);
    if (writes.empty() || task.writes.empty() || data.size() != whole) return false;  // a shard travels as it is
    const auto [begin, end] = slice_of(writes[0], whole);
    if (end - begin == whole) return false;
    // (The message and the tensor are the device's memory: its ops copy.)
    ops_of_(t.device).copy(reinterpret_cast<float*>(task.writes[0].data), data.data() + begin, end - begin);
    return true;
  }
  if (t.purpose != partition::Purpose::ps_pull || !servers_) return false;
  servers_->pulled(task.task, task.iteration, data);
  return true;
}

}  // namespace hetflow::exec
