#pragma once
// A training checkpoint: what a run needs to go on where another one stopped, as a folder
//   model.safetensors       the FP32 weights (HuggingFace names; --init-weights reads it too)
//   exp_avg.safetensors     AdamW's first moments, under the same names and shapes
//   exp_avg_sq.safetensors  AdamW's second moments
//   trainer_state.json      the counters (TrainingProgress)
// Every tensor is whole, whatever the layout that wrote it: a run of another layout (other
// pipeline, tensor or data degrees, another ZeRO stage) resumes it, each chunk taking its
// share as it takes a file's weights (exec/training.hpp), each replica its shard.
//
// What it promises:
//  - Resumed with the same plan and options, a run continues bit for bit as one that never
//    stopped: the weights, the moments, the data position (the next step reads the token
//    source's batch `iterations`), AdamW's step count (its bias correction and the learning
//    rate schedule count the steps taken) and the dynamic loss scaler's state.
//  - A folder is replaced whole or not at all: the files go to `<folder>.partial` first,
//    which then takes the folder's place (a crash between the two renames leaves
//    `<folder>.previous`, the checkpoint before, intact).
//  - Opening checks the counters and that the three tensor files hold the same names and
//    shapes; a refusal is an InputError naming the file, line and field.
#include <string>

#include "exec/checkpoint.hpp"
#include "exec/loss_scale.hpp"
#include "exec/safetensors.hpp"

namespace hetflow::exec {

// The counters of a training run (trainer_state.json).
struct TrainingProgress {
  long long iterations = 0;       // global batches run: the next step reads the token source's batch `iterations`
  long long optimizer_steps = 0;  // AdamW steps taken (a skipped step is not one): the bias correction, the schedule
  int global_batch = 0;           // samples a step; a resumed run must take as many (its data and schedule count them)
  int seq_len = 0;                // tokens a sample
  LossScaler::State loss_scaler;  // dynamic loss scaling's state after the last step
  std::string model;              // Training::describe() of the run that wrote it (for messages)
};

std::string training_progress_json(const TrainingProgress& progress);
// InputError naming `file`, the line and the field for anything missing, mistyped or out of range.
TrainingProgress parse_training_progress(const std::string& text, const std::string& file);

// What a resumed Training takes: the weights, the moments, the counters (all must outlive it).
struct ResumeFrom {
  const WeightSource& weights;
  const WeightSource& exp_avg;
  const WeightSource& exp_avg_sq;
  TrainingProgress progress;
  std::string path;  // what errors name (trainer_state.json's folder)
};

// A training's state in memory (Training::state()), as a checkpoint writes it.
struct TrainingState {
  SafetensorsFile weights, exp_avg, exp_avg_sq;
  TrainingProgress progress;
};

// Writes `state` as the checkpoint folder `folder` (its parent must exist). InputError naming
// the path that could not be written.
void write_training_checkpoint(const std::string& folder, const TrainingState& state);

// A checkpoint folder opened: its counters read and checked, its tensor files' headers read
// (tensors are read one at a time as a resumed Training asks for them).
class TrainingCheckpoint {
 public:
  explicit TrainingCheckpoint(const std::string& folder);
  ResumeFrom resume() const { return {weights_, exp_avg_, exp_avg_sq_, progress_, folder_}; }
  const TrainingProgress& progress() const { return progress_; }

 private:
  std::string folder_;
  Checkpoint weights_, exp_avg_, exp_avg_sq_;
  TrainingProgress progress_;
};

}  // namespace hetflow::exec
