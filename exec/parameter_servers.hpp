#pragma once
// Parameter servers and WSP for real training (partition::SyncKind::parameter_server, wsp):
// each server device holds the master weights and AdamW moments of the layers the plan gives
// it (Layout::sync.layer_server), by HuggingFace name, so a tied embedding whose two ends
// share a server is one parameter.
//  - A chunk's gradients are taken when its device's last compute task of an iteration ends
//    (take); each push carries the chunk's gradients of the server's layers.
//  - A server's update adds the pushes of every (worker, chunk, tensor-parallel rank) in that
//    order, clips by the global norm (GlobalNorm: the servers' parts meet) and steps AdamW
//    (OptimizerStep), keeping the weights of each iteration.
//  - A pull carries iteration i's weights back, each rank its pieces of them; the chunk adopts
//    them when its first forward of iteration i + D + 1 starts (the plan's staleness edge):
//    D = 0 is synchronous training.
// A plan whose order edges put a push before the gradients it carries, or a pull before the
// update it brings, gets a PlanError naming them, not a crash. Thread-safe.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "exec/backend.hpp"
#include "exec/checkpoint.hpp"
#include "exec/decoder.hpp"
#include "exec/global_norm.hpp"
#include "exec/optimizer_step.hpp"
#include "exec/ranks.hpp"
#include "exec/step_log.hpp"
#include "exec/training_checkpoint.hpp"
#include "partition/plan.hpp"

namespace hetflow::exec {

class ParameterServers {
 public:
  using ChunkKey = std::tuple<int, int, int>;  // (device, worker, stage)
  // `chunks`: the layout of every chunk of the plan, this process's or not (it must outlive
  // this object); `local`: whether a device is this process's (its servers are made here).
  // Servers start from `seed`'s initialisation or `init`'s tensors (InputError naming a
  // missing one), and a resumed run's from its checkpoint's moments and step count too.
  // PlanError for a tied embedding whose two ends have different servers.
  ParameterServers(const partition::Plan& plan, const DecoderShape& shape, const std::map<ChunkKey, ChunkParams>& chunks,
                   std::function<bool(int)> local, std::uint64_t seed, const WeightSource* init,
                   const ResumeFrom* resume = nullptr);

  int staleness() const { return staleness_; }  // D
  // Whether `task` ends its device's gradients of an iteration (they are taken after it).
  bool takes_gradients(int task) const { return takes_gradients_[static_cast<size_t>(task)] != 0; }
  // A chunk's gradients of `iteration` (host floats, its whole array), taken.
  void take(const ChunkKey& chunk, int iteration, std::vector<float> grads);
  // The floats of a pushed_grad tensor: what its chunk really pushes (under tensor
  // parallelism a rank's replicated parameters whole, where the plan counts 1/t of them);
  // nullopt for any other tensor.
  std::optional<size_t> pushed_floats(int tensor) const;
  // Of a push or pull send task: the floats it carries, known before the run, and the
  // floats themselves for `iteration`. nullopt for any other task.
  std::optional<size_t> message_floats(int send_task) const;
  std::optional<std::vector<float>> message(int send_task, int iteration) const;
  // A pull's floats arrived for the chunk of `recv_task`.
  void pulled(int recv_task, int iteration, std::span<const float> data);
  // The weights the chunk adopts before its first forward of iteration + D + 1: `upload`
  // gets each slot it holds and its floats.
  void adopt(const ChunkKey& chunk, int iteration,
             const std::function<void(const ParamSlot&, std::span<const float>)>& upload);
  // A server's update task.
  void update(TaskContext& task, const std::atomic<bool>& stop, OptimizerStep& step, GlobalNorm& norm, StepLog& log);

  // The latest weights of every parameter a server here holds (and, after merge(), those of
  // other ranks' servers), by name, whole; or (`array` 1, 2) their AdamW moments.
  std::map<std::string, const float*> weights(int array = 0) const;
  // This process's servers' weights (`moments`: and moments), for rank 0; merge() keeps them.
  void save(std::vector<std::byte>& out, bool moments = false) const;
  void merge(ByteReader& in);

 private:
  struct Param {
    std::vector<float> p, m, v, g;
    bool decays = false;
    bool balancing = false;  // a router's balancing bias (ParamSlot::balancing)
    int steps = 0;  // AdamW steps taken
  };
  struct Server {
    std::map<std::string, Param> params;                                  // by HuggingFace name
    std::map<int, std::map<std::string, std::vector<float>>> versions;  // weights after each iteration's update
  };
  std::vector<const ParamSlot*> served_slots(const ChunkParams& chunk, int server) const;
  bool is_push_or_pull(const partition::Task& t) const;
  const ChunkParams& chunk(const ChunkKey& key, int task) const;
  // Under mutex_: a chunk's taken gradients, a server's weights of an iteration.
  const std::vector<float>& gradients_of(const ChunkKey& chunk, int iteration) const;
  const std::map<std::string, std::vector<float>>& weights_of(int server, int iteration) const;

  const partition::Plan& plan_;
  const std::map<ChunkKey, ChunkParams>& chunks_;
  int staleness_ = 0;
  std::map<int, Server> servers_;                       // by device, this process's
  std::vector<char> takes_gradients_;                   // per task
  std::map<int, std::tuple<int, int, int>> push_source_;  // pushed_grad tensor -> (worker, stage, pushing device)
  mutable std::mutex mutex_;
  std::map<std::pair<ChunkKey, int>, std::vector<float>> taken_;        // (chunk, iteration)
  std::map<std::tuple<ChunkKey, int, int>, std::vector<float>> pulled_;  // (chunk, iteration, server)
  std::map<std::string, std::vector<float>> remote_[3];  // other ranks' servers' weights and moments, by name
};

}  // namespace hetflow::exec
