// Between the chunks of one virtual worker: each forward's output to the next chunk and each
// backward's input gradient to the previous one, as send/recv pairs on the channel between
// the two devices ("act" forward, "grad" backward). Built in producer order, rank by rank,
// so each channel carries its tensors in the order they are made. Receiving tensor rank j
// gets 1/t of the tensor (t: its rank's degree) from sending rank j % t' (t': the sender's
// degree; see prepare_boundaries).
#include "partition/plan_builder_detail.hpp"

namespace hetflow::partition::builder {

void Builder::add_pipeline_phase() {
  const size_t built = built_workers();
  for (size_t w = 0; w < built; ++w) add_pipeline_transfers(static_cast<int>(w));
}

void Builder::add_pipeline_transfers(int w) {
  const VirtualWorker& vw = worker(w);
  const int p = static_cast<int>(vw.ranks.size());
  for (int r = 0; r < p; ++r) {
    for (const ScheduledOp& o : programs_[static_cast<size_t>(w)][static_cast<size_t>(r)]) {
      if (o.kind != OpKind::W) connect(w, o.chunk * p + r, o.microbatch, o.kind);
    }
  }
}

void Builder::connect(int w, int stage, int mb, OpKind kind) {
  const bool forward = kind == OpKind::F;
  const int stages = static_cast<int>(worker(w).stages.size());
  const int to = forward ? stage + 1 : stage - 1;
  if (to < 0 || to >= stages) return;
  const ChunkWork& work = work_[static_cast<size_t>(w)][static_cast<size_t>(stage)];
  const double whole = forward ? work.output_bytes : work.input_bytes;
  const int t_from = degree(w, stage), t_to = degree(w, to);
  const double bytes = whole / t_to;  // Megatron's scatter/gather: 1/t per receiving rank
  const Purpose purpose = forward ? Purpose::activation : Purpose::gradient;
  const bool several = t_to > t_from;  // a sending rank serves several receiving ranks
  if (several) sends_.assign(static_cast<size_t>(t_to), -1);
  for (int j = 0; j < t_to; ++j) {
    const int i = j % t_from;
    const OpRecord& producer = op(w, stage, mb, kind, i);
    const OpRecord& consumer = op(w, to, mb, kind, j);
    const int src = device_of(w, stage, i), dst = device_of(w, to, j);
    if (src == dst || bytes <= 0 || producer.output < 0) {
      // Nothing flows, or the pass's collective does not write what flows: order still holds.
      if (producer.output < 0 || plan_.tensor(producer.output).producer != producer.done) {
        plan_.add_order(producer.done, consumer.task);
      }
      continue;  // same device: the consumer reads the producer's tensor in place
    }
    const size_t at = slot(w, to, mb, j);
    const auto& slices = forward ? input_slices_ : grad_slices_;
    const auto& wholes = forward ? inputs_ : output_grads_;
    const int slice = slices[static_cast<size_t>(w)][at];
    const int received = slice >= 0 ? slice : wholes[static_cast<size_t>(w)][at];
    Task like = plan_.task(producer.done);
    const auto [send, recv] =
        add_transfer(src, dst, forward ? "act" : "grad", bytes, purpose, like, producer.output, received);
    // A pass done by a collective that does not write the tensor (a backward's f traffic):
    // the send still waits for it.
    if (plan_.tensor(producer.output).producer != producer.done) plan_.add_order(producer.done, send);
    set_free_after(producer.output, send);
    if (several) sends_[static_cast<size_t>(j)] = send;
  }
  if (!several) return;
  // Sending rank i's tensor is read by its sends to ranks i, i + t_from, ...: it is freed
  // after the last, which follows the others.
  for (int i = 0; i < t_from; ++i) {
    const int last = sends_[static_cast<size_t>(i + (t_to - 1 - i) / t_from * t_from)];
    if (last < 0) continue;
    for (int j = i; j < t_to; j += t_from) {
      const int send = sends_[static_cast<size_t>(j)];
      if (send >= 0 && send != last) plan_.add_order(send, last);
    }
  }
}

}  // namespace hetflow::partition::builder
