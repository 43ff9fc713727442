// Fuzz target: a training checkpoint's counters (exec::parse_training_progress), as --resume
// reads trainer_state.json before it opens any tensor.
#include "exec/training_checkpoint.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string text = fuzz::text_of(data, size);
  const std::string file = "trainer_state.json";
  exec::TrainingProgress p;
  try {
    p = exec::parse_training_progress(text, file);
  } catch (const InputError& e) {
    fuzz::check_refusal(e, file, text);
    return 0;
  }
  // What was accepted is in range, and writes back to a state that reads the same.
  FUZZ_CHECK(p.iterations >= 0 && p.optimizer_steps >= 0 && p.optimizer_steps <= p.iterations);
  FUZZ_CHECK(p.global_batch > 0 && p.seq_len > 0);
  FUZZ_CHECK(p.loss_scaler.scale >= exec::kMinLossScale && p.loss_scaler.scale <= exec::kMaxLossScale);
  const exec::TrainingProgress back = exec::parse_training_progress(exec::training_progress_json(p), file);
  FUZZ_CHECK(back.iterations == p.iterations && back.optimizer_steps == p.optimizer_steps &&
             back.global_batch == p.global_batch && back.seq_len == p.seq_len &&
             back.loss_scaler.scale == p.loss_scaler.scale && back.loss_scaler.dynamic == p.loss_scaler.dynamic &&
             back.loss_scaler.growth_tracker == p.loss_scaler.growth_tracker &&
             back.loss_scaler.hysteresis_tracker == p.loss_scaler.hysteresis_tracker && back.model == p.model);
  return 0;
}
