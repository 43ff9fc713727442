#pragma once
// Real training: what each compute task of a decoder-transformer plan computes, and which
// floats each of its gradient collectives reduces. A back end calls it (the CPU's,
// exec/cpu_backend.hpp); the engine still decides when every task runs.
//
// Training maps the plan's tasks onto the loop's seams, each with its own state: the
// chunks (exec/chunk_state.hpp), the batch feed (batch_feed.hpp), gradient synchronisation
// and ZeRO's shards (gradient_sync.hpp), the optimizer step (optimizer_step.hpp) and the
// global norm's meeting (global_norm.hpp), parameter servers (parameter_servers.hpp), and
// what each step measured (step_log.hpp), the weights at the end (model_weights.hpp). What
// it keeps itself: the chunks found from the plan, tensor-parallel exchanges inside a pass,
// boundary slices, the gradient norm's collective.
//
// Where the numbers live: each device's chunks keep their parameters, gradients and Adam
// moments in that device's DecoderOps memory (exec/decoder_ops.hpp; the CPU's by default) and
// touch them only through its ops, the optimizer's scale, squared norm and AdamW included;
// what a gradient collective reduces (collective_data) is that memory too. Host copies are
// made only where the host needs the values: a file's weights (uploaded), a parameter
// server's pushes and pulls (servers keep host arrays), weights() and collect_at_root().
//
// How the plan maps onto the math (everything comes from the plan):
//  - Each (device, chunk) holds the FP32 parameters of the chunk's layers
//    (exec/decoder_params.hpp), their gradients and Adam moments. Every replica starts from
//    the same values: a seeded initialisation or a safetensors file with HuggingFace names.
//  - Step k's global batch is the token source's batch k (B = the sum over virtual workers
//    of micro-batches x micro-batch size); worker w's micro-batch m takes samples
//    base_w + m * mbs .. + mbs, base_w the samples of the workers before it.
//  - F runs the chunk's forward (tokens on the first chunk, the received activation
//    otherwise), keeping what its backward needs; the last chunk adds the loss of each token
//    weighted 1 / (B T). B (and W when the schedule splits the backward) add to the chunk's
//    gradients; the activations and their gradients travel in the plan's tensors.
//  - A data-parallel all-reduce of layers [a, b) reduces those layers' gradients (its
//    bucket's share of them); the embedding all-reduce the tied embedding's gradient (the
//    first chunk's table, the last chunk's copy). Sums, so the result is the gradient of the
//    global mean loss.
//  - The optimizer task runs AdamW (decoupled weight decay on parameters of two or more
//    dimensions) on each of the device's chunks, after clipping by the global gradient norm
//    when asked: the devices' optimizer tasks meet to add their parts of the norm (each
//    parameter once: virtual worker 0's devices, tied copies left out).
//  - Parameter server and WSP: a server holds the master weights and Adam moments of the
//    layers the plan gives it (by HuggingFace name, so a tied embedding whose two ends share
//    a server is one parameter). A device's gradients are taken (and its buffer zeroed) when
//    its last compute task of the iteration ends; each push carries the chunk's gradients of
//    the server's layers; the server's update adds the pushes of every (worker, chunk) in
//    worker order, clips by the global norm and steps AdamW, keeping the weights of each
//    iteration; a pull carries iteration i's weights back, and the chunk adopts them when its
//    first forward of iteration i + D + 1 starts (the plan's staleness edge): D = 0 is
//    synchronous training.
//
//  - Tensor parallelism (Megatron): a chunk's ranks hold their shares (exec/decoder_params.hpp)
//    and exchange between sublayers inside the compute task, through the back end's
//    TensorParallelExchange: each exchange is the task's next in-task collective message in
//    the plan (Plan::inside), of the kind and size listed, on its communicator, and a pass
//    must make all it lists (Group, training.cpp): a plan that lists other collectives is
//    refused with the task and the message named. Every rank's output (and input gradient)
//    is whole when its task ends. A boundary activation the plan sends in 1/t slices leaves
//    the sender as the receiving rank's slice (message(), find_send_slices) and is
//    all-gathered by the plan's collective task. Sequence parallelism: the norms and residual
//    adds run on the rank's rows between in-task all-gathers and reduce-scatters
//    (exec/decoder.hpp); a chunk's last backward of a step sums the gains every rank holds
//    whole (the plan's last in-task all-reduce of that task).
//  - Stages and workers of different tensor-parallel degrees: a boundary rank takes its
//    slice of the whole activation as above. A data-parallel (or tied-embedding) all-reduce
//    between ranks of different degrees sums the part of Megatron's split its members hold
//    in common (exec/decoder_params.hpp, SplitPart: [1/4, 1/2) between rank 0 of 2 and
//    rank 1 of 4), gathered from each member's gradients in the part's order and put back
//    after; parameters every rank holds whole (norms, some biases, positions) go with every
//    part, each part summing them from the backward's values, so every rank ends with the
//    workers' sum (with three workers or more, the ring adds a float in an order that
//    depends on its place in the part, so a worker's ranks may differ in its last bit).
//
//  - ZeRO (Layout::sync.zero, partition/plan_builder_zero.cpp): what a replica owns is the
//    plan's: the part of each reduce-scatter's buffer that the collective's steps leave it
//    (partition::member_part), the same part its all-gathers bring. It keeps AdamW's moments
//    for that shard alone, from stage 2 its gradients, from stage 3 its parameters
//    (ChunkState::keep_owned_state). Its optimizer steps that shard alone; at stages 1 and 2
//    the parameters it does not own are set to NaN after each step, so a pass that read one
//    before the plan's all-gather would show it in the loss. Stage 1 reduce-scatters and all-gathers
//    in place, bucket by bucket; from stage 2 a pass adds its gradients to a transient whole
//    buffer (the plan's unsharded_grad) that its reduce-scatter adds into the shard; stage 3
//    passes read a transient whole copy of the parameters (gathered_weight) their
//    all-gather makes, freed when its last reader ends. The gradient norm meets over every
//    device (each shard once). weights() takes each element from the replica that owns it.
//    A tied embedding between stages adds its two copies whole before stage 1 scatters
//    them (plan_builder_sync.cpp). Refused with PlanError: that sum from stage 2 (it would
//    pair elements the replicas shard differently), sequence parallelism from stage 2 (its
//    gain gradients are summed over the ranks once per step, after every micro-batch's
//    were scattered).
//  - Training checkpoints (exec/training_checkpoint.hpp): state() is weights() and both
//    AdamW moments put together the same way, with the counters; a Training resumed from
//    one (ResumeFrom) loads its moments as weights load, each chunk its share (ZeRO then
//    keeps the shard's), and continues its data position, AdamW step count and loss scaler,
//    so that the run goes on bit for bit as one that never stopped.
//  - Under mpirun (`ranks`, several of them) a process holds only its rank's devices' chunks
//    and servers. The devices' parts of the global norm meet in two steps: this rank's in
//    the process, then every rank's through Ranks::exchange, summed in device order as
//    threads sum them (bitwise the same). After the run, collect_at_root() brings the
//    losses and worker 0's weights (the servers', under a parameter server) to rank 0,
//    where losses() and weights() then cover the whole model.
//
// Covered now: GPT-2 and LLaMA style decoders, LLaMA style mixtures of experts; any pipeline
// schedule, virtual stages, micro-batching; tensor parallelism, of one degree or different ones
// per stage and worker (of MoE blocks without expert groups: every rank routes every token,
// exec/decoder_moe.cpp); sequence and context parallelism; expert parallelism; data
// parallelism by all-reduce (ZeRO stages 0-3), parameter server or WSP; recomputation none,
// selective and full. Refused with PlanError naming the reason: a tied embedding whose two
// ends sit on different servers, tensor parallelism of expert-parallel MoE blocks.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "exec/backend.hpp"
#include "exec/batch_feed.hpp"
#include "exec/checkpoint.hpp"
#include "exec/chunk_state.hpp"
#include "exec/decoder.hpp"
#include "exec/global_norm.hpp"
#include "exec/gradient_sync.hpp"
#include "exec/model_weights.hpp"
#include "exec/optimizer_step.hpp"
#include "exec/parameter_servers.hpp"
#include "exec/ranks.hpp"
#include "exec/safetensors.hpp"
#include "exec/step_log.hpp"
#include "exec/token_data.hpp"
#include "exec/training_checkpoint.hpp"
#include "partition/plan.hpp"

namespace hetflow::exec {

// How a back end runs the collectives a tensor-parallel chunk needs inside a compute task,
// among the devices of a communicator of the plan (the members in the communicator's order
// are the ranks; semantics as exec/decoder.hpp's TensorParallelGroup).
class TensorParallelExchange {
 public:
  virtual ~TensorParallelExchange() = default;
  virtual void all_reduce(TaskContext& task, int communicator, std::span<float> data, bool max) = 0;
  virtual void all_gather(TaskContext& task, int communicator, std::span<float> data,
                          std::span<const size_t> parts) = 0;
  virtual void reduce_scatter(TaskContext& task, int communicator, std::span<float> data,
                              std::span<const size_t> parts) = 0;
  // Expert parallelism's dispatch or combine (TensorParallelGroup::all_to_all): host floats
  // of sizes the router chose. A back end without it throws PlanError.
  virtual std::vector<float> all_to_all(TaskContext& task, int communicator, std::span<const float> send,
                                        std::span<const size_t> send_parts, std::vector<size_t>& recv_parts);
  // A ring's step (TensorParallelGroup::send_recv): `send` to the communicator's next member,
  // `receive` from its previous one, `meanwhile` run while they move. A back end without it
  // throws PlanError.
  virtual void send_recv(TaskContext& task, int communicator, std::span<const float> send, std::span<float> receive,
                         const std::function<void()>& meanwhile);
};

class Training {
 public:
  // Throws PlanError when the plan's network or layout is not covered (see above), InputError
  // when `init` lacks a parameter or has one of the wrong shape. `init_path` names the
  // weights in errors.
  Training(const partition::Plan& plan, std::unique_ptr<TokenSource> data, OptimizerOptions optimizer,
              std::uint64_t seed, const SafetensorsFile* init = nullptr, const std::string& init_path = "",
              const Ranks* ranks = nullptr);
  // The same from weights read tensor by tensor (a checkpoint on disk: exec/checkpoint.hpp):
  // each tensor this rank's parameters need is read once, one at a time, and every local
  // chunk holding a share of it takes its share (ranks holding a tied embedding also read the
  // embedding and lm_head together, to check they are equal).
  Training(const partition::Plan& plan, std::unique_ptr<TokenSource> data, OptimizerOptions optimizer,
              std::uint64_t seed, const WeightSource& init, const Ranks* ranks = nullptr);
  // Resumed from a training checkpoint (exec/training_checkpoint.hpp), read as the
  // constructor runs: its weights as above, its moments likewise, its counters (the next
  // step reads the data after its last). InputError when the plan's global batch or
  // sequence is not the checkpoint's (field global_batch, seq_len of its trainer_state.json)
  // or a moment is missing. Under parameter servers the servers take the moments and step
  // count; under WSP its workers start together from the servers' weights.
  Training(const partition::Plan& plan, std::unique_ptr<TokenSource> data, OptimizerOptions optimizer,
              std::uint64_t seed, const ResumeFrom& resume, const Ranks* ranks = nullptr);
  ~Training();
  // Not copied or moved: its seams keep references to its maps.
  Training(const Training&) = delete;
  Training& operator=(const Training&) = delete;

  // Where each device's arrays live: this rank's chunks start in the CPU's memory (a CPU ops
  // of their own per device, so each device's memory() is its own) and move to
  // ops_of_device(d)'s (which must outlive this object). Before the run (no stash alive): a
  // back end calls it from prepare(), once its devices exist; place_home() brings them back.
  using OpsOfDevice = std::function<const DecoderOps&(int device)>;
  void place(OpsOfDevice ops_of_device);
  void place_home();
  // What a back end must know to run this training: tensor-parallel chunks (their in-task
  // collectives go through a TensorParallelExchange) and parameter servers (servers keep
  // host arrays; pushes and pulls are host floats, message() and receive()).
  bool tensor_parallel() const;
  bool parameter_server() const { return parameter_server_; }
  bool loss_scaling() const { return step_->scaling(); }
  // The ops whose memory device d's arrays (and collective_data()'s floats) are in.
  const DecoderOps& ops_of(int device) const { return ops_of_(device); }

  // Host bytes the engine allocates for a tensor: boundary activations and their gradients
  // in FP32; nothing for what this class keeps itself (parameters, gradients, optimizer
  // state, stashes).
  size_t buffer_bytes(int tensor) const;
  // F, B, W and optimizer tasks; `exchange` carries a tensor-parallel chunk's all-reduces.
  void compute(TaskContext& task, const std::atomic<bool>& stop, TensorParallelExchange* exchange = nullptr);
  // A load task (partition/loading.hpp): reads its micro-batch's tokens from the token
  // source (the step's samples this worker's micro-batch takes, TokenSource::samples) and
  // keeps them for the forwards of that micro-batch, which read their tokens and targets
  // from it. A forward that finds none (a tensor-parallel rank that is not ordered after the
  // load, a rank of another process, a plan without load tasks) reads the same samples
  // itself: the math is the same either way.
  void load_micro_batch(TaskContext& task);
  // Activation offload's copies (to_host and to_device of a chunk's micro-batch): its stash's
  // activations to host memory, released on the device, and back. The offload of optimizer
  // state (no chunk) moves nothing: its host memory is the chunk's own arrays.
  void copy_stash(TaskContext& task);
  // The floats a gradient collective reduces in place (empty: nothing of the model's), and
  // after it, where they go back: between workers of different tensor-parallel degrees they
  // are gathered from the gradients (the part of the split the members hold in common).
  std::span<float> collective_data(const TaskContext& task);
  void collective_done(const TaskContext& task);
  // Parameter-server transfers: what a push or pull sends (nullopt: the tensor's bytes), and
  // what its receive does with the floats (false: copy them into the written tensor). A
  // boundary activation that arrives whole where the tensor is a 1/t slice is cut here, by
  // the device's ops (the message and the tensor are its memory; a pull's are host floats).
  std::optional<std::vector<float>> message(const TaskContext& task);
  // How many floats message() gives for that send task, known before the run (a back end
  // whose receives must know their size); nullopt: the tensor's bytes.
  std::optional<size_t> message_floats(int send_task) const;
  bool receive(const TaskContext& task, std::span<const float> data);

  // Under mpirun, after the run, on every rank: rank 0 takes the other ranks' losses and
  // weights (`with_moments`: AdamW's moments too), so that its losses(), weights() and
  // state() cover every device. Again between the segments of a run cut at checkpoints
  // (exec/segmented_run.hpp): each step's losses come once, the weights are the latest.
  void collect_at_root(bool with_moments = false);

  // The mean token loss of each step (global batch) run so far.
  std::vector<double> losses() const;
  // A mixture of experts' load-balancing loss of each step (Megatron-Core's, before its
  // coefficient, as Megatron logs it: 1 when the routers spread the copies evenly): the mean
  // over the MoE layers and micro-batches. Empty for a model without experts.
  std::vector<double> balance_losses() const;
  // Loss scaling (OptimizerOptions::loss_scale): the scale after the last step, and the
  // steps skipped because their gradients were not finite.
  double loss_scale() const;
  int skipped_steps() const;
  // The learning rate of each step of losses(): the schedule's rate after the steps taken
  // before it (in double; the optimizer applies it rounded to fp32), NaN for a skipped one.
  std::vector<double> learning_rates() const;
  // Iterations whose global gradient norm (met between devices) some task here has yet to
  // read: 0 after a run; at most the plan's staleness + 1 during one.
  size_t norms_in_flight() const;
  // Virtual worker 0's parameters with HuggingFace names and shapes (tied copies left out).
  SafetensorsFile weights() const;
  // What a training checkpoint holds after the run: weights(), both moments under the same
  // names (each element from the replica that owns it; under parameter servers the servers'),
  // the counters (this run's steps after those of the checkpoint it resumed).
  TrainingState state() const;
  std::string describe() const;  // family, shapes, data source
  const DecoderShape& shape() const { return shape_; }

  using Chunk = ChunkState;  // one (device, chunk): parameters, gradients, moments, stashes

 private:
  void forward(TaskContext& task, Chunk& c, TensorParallelExchange* exchange);
  void backward(TaskContext& task, Chunk& c, bool split, TensorParallelExchange* exchange);
  void optimizer(TaskContext& task, const std::atomic<bool>& stop);
  void step_balancing(Chunk& c);  // the routers' balancing biases, by their loads' signs
  struct Init {
    const WeightSource* source = nullptr;
    const ResumeFrom* resume = nullptr;  // its moments and counters (source: its weights)
  };
  Training(const partition::Plan& plan, std::unique_ptr<TokenSource> data, OptimizerOptions optimizer,
              std::uint64_t seed, Init init, const Ranks* ranks);
  // The constructor's phases, in order (exec/training_setup.cpp).
  void read_layout();
  void make_chunks(std::uint64_t seed);
  // Each local chunk's share of every tensor of `init` into its parameters, or `into`.
  void load_weights(const WeightSource& init, OpsFloats ChunkState::*into = &ChunkState::params);
  void resume(const ResumeFrom& from);
  TrainingProgress start_;  // where the run resumed (zeros: a fresh one)
  void find_last_backwards();
  void map_norms();  // the float each gradient-norm collective reduces
  // Parameter servers: a device's chunks' gradients to their servers after its last compute
  // of an iteration, and a chunk's adoption of the weights pulled D + 1 iterations back.
  void take_gradients(int device, int iteration);
  void adopt_pulled(Chunk& c, int iteration);
  std::pair<size_t, size_t> slice_of(int tensor, size_t whole) const;
  void check_sequence_shards() const;
  // A boundary send whose receiving rank keeps a 1/t slice (Megatron's scatter/gather) sends
  // that slice alone, as the plan counts it: per send task, [begin, end) of the whole
  // activation (empty: the tensor as it is).
  void find_send_slices();
  std::vector<std::pair<size_t, size_t>> send_slice_;
  bool local(int device) const;

  int zero_stage_ = 0;  // 0 unless the plan shards over several replicas
  std::map<int, int> weight_of_gathered_;  // ZeRO 3: gathered_weight tensor -> the weight its all-gather reads
  std::map<int, double> piece_of_weight_;  // such a weight -> the parameters its all-gathers gather
  int weight_read_by(int task) const;  // its weight tensor, through a gathered copy's all-gather

  const partition::Plan& plan_;
  const Ranks* ranks_ = nullptr;  // null: every device is here
  std::vector<std::unique_ptr<CpuDecoderOps>> home_;  // per device: where its arrays start
  OpsOfDevice ops_of_;
  DecoderShape shape_;
  std::unique_ptr<TokenSource> data_;  // until read_layout gives it to feed_
  OptimizerOptions optimizer_options_;
  std::map<int, std::pair<int, int>> tp_position_;  // device -> (its rank in its tensor-parallel group, the group's size)
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::map<int, Chunk*> chunk_of_tensor_;  // weight and weight_grad tensor ids -> chunk
  std::map<std::tuple<int, int, int>, Chunk*> chunk_at_;  // (device, worker, stage) -> chunk of this rank
  std::map<std::tuple<int, int, int>, ChunkParams> params_at_;  // (device, worker, stage) -> its layout, every rank's
  // The seams (torchtitan's), made by the constructor's phases once the layout's sizes and
  // the chunks are known; declared after the maps sync_ and servers_ keep references to.
  std::optional<BatchFeed> feed_;
  std::optional<OptimizerStep> step_;
  std::optional<GlobalNorm> norm_;  // where the plan has no gradient-norm collective
  std::optional<StepLog> log_;
  std::optional<GradientSync> sync_;         // what each gradient collective moves
  std::optional<ParameterServers> servers_;  // under a parameter server or WSP
  std::optional<ModelWeights> weights_;      // worker 0's parameters, gathered at rank 0
  // The gradient-norm all-reduce (Purpose::gradient_norm) of each device: whether the plan
  // has one, and the float it reduces (the device's sum of squares, then its worker's). Each
  // device's slot is written and read by its own thread alone.
  std::vector<char> norm_task_;     // per task
  std::vector<char> has_norm_;      // per device
  std::vector<OpsFloats> norm_square_;  // per device: one float in its ops' memory
  bool plan_has_norm_ = false;
  double local_sum_squares(int device, int iteration) const;

  std::vector<int> expert_placement_;  // expert parallelism: each expert's rank

  bool parameter_server_ = false;
  std::vector<char> last_backward_;          // per task: its chunk's last B into a gradient buffer
};

}  // namespace hetflow::exec
