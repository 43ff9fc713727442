// Training's transfers (exec/training.hpp): what a send carries (a boundary activation's
// slice for a tensor-parallel receiver, a parameter server's push or pull), and the chunks'
// side of the servers (their gradients taken, the weights they adopt).
#include <algorithm>
#include <optional>
#include <span>
#include <vector>

#include "exec/training.hpp"

#include "exec/plan_tensors.hpp"
#include "model/error.hpp"
#include "partition/run_graph.hpp"

namespace hetflow::exec {

using partition::TaskKind;

void Training::take_gradients(int device, int iteration) {
  for (auto& c : chunks_) {
    if (c->device != device) continue;
    std::vector<float> taken(c->grads.size());
    c->ops().download(taken.data(), c->grads.data(), c->grads.size());
    c->ops().zero(c->grads.data(), c->grads.size());
    servers_->take({c->device, c->worker, c->stage}, iteration, std::move(taken));
  }
}

void Training::adopt_pulled(Chunk& c, int iteration) {
  servers_->adopt({c.device, c.worker, c.stage}, iteration, [&](const ParamSlot& slot, std::span<const float> values) {
    c.ops().upload(c.params.data() + slot.offset, values.data(), values.size());
  });
}

void Training::find_send_slices() {
  send_slice_.assign(plan_.tasks.size(), {0, 0});
  const partition::RunGraph graph(plan_);
  const auto whole = static_cast<size_t>(plan_.layout.micro_batch_size) * static_cast<size_t>(shape_.S) *
                     static_cast<size_t>(shape_.C);
  for (size_t r = 0; r < plan_.tasks.size(); ++r) {
    const partition::Task& t = plan_.tasks[r];
    if (t.kind != TaskKind::recv ||
        (t.purpose != partition::Purpose::activation && t.purpose != partition::Purpose::gradient)) {
      continue;
    }
    const auto writes = plan_.writes(static_cast<int>(r));
    const int send = graph.partner(static_cast<int>(r));
    if (writes.empty() || send < 0) continue;
    const auto sent = plan_.reads(send);
    const auto slice = slice_of(writes[0], whole);
    // (A sequence shard travels as it is: the sender holds its rows, not the whole.)
    const bool whole_sent = !sent.empty() && slice_of(sent[0], whole) == std::pair<size_t, size_t>{0, whole};
    if (whole_sent && slice.second - slice.first < whole) send_slice_[static_cast<size_t>(send)] = slice;
  }
}

std::optional<size_t> Training::message_floats(int send_task) const {
  if (const auto [begin, end] = send_slice_[static_cast<size_t>(send_task)]; end > begin) return end - begin;
  return servers_ ? servers_->message_floats(send_task) : std::nullopt;
}

std::optional<std::vector<float>> Training::message(const TaskContext& task) {
  const partition::Task& t = *task.spec;
  if (const auto [begin, end] = send_slice_[static_cast<size_t>(task.task)]; end > begin) {
    // (The activation is the device's memory: its ops copy it out.)
    std::vector<float> out(end - begin);
    if (task.reads.empty() || task.reads[0].size_bytes < end * sizeof(float)) {
      throw PlanError("send task " + std::to_string(task.task) + " reads no whole activation to slice");
    }
    ops_of_(t.device).download(out.data(), reinterpret_cast<const float*>(task.reads[0].data) + begin, out.size());
    return out;
  }
  return servers_ ? servers_->message(task.task, task.iteration) : std::nullopt;
}

}  // namespace hetflow::exec
