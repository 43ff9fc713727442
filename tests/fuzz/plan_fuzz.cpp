// Fuzz target: the plan reader (partition::read_plan_json, format 3, with the cluster and
// network it embeds), then validation, which must name the problems of whatever the reader
// accepted without reading out of range (as `hetflow validate` does), and the analytic
// estimate of a plan found valid.
#include "partition/cost_model.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_io.hpp"
#include "partition/validate.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string text = fuzz::text_of(data, size);
  const std::string file = "plan.json";
  partition::Plan plan;
  try {
    plan = partition::read_plan_json(text, file);
  } catch (const InputError& e) {
    fuzz::check_refusal(e, file, text);
    return 0;
  }
  if (!partition::validate_plan(plan).ok()) return 0;
  const partition::CostModel cost(plan.cluster, plan.layout.precision, model::Calibration{});
  const partition::Estimate estimate = partition::estimate_plan(plan, cost);
  FUZZ_CHECK(estimate.iteration_time_s >= 0);
  return 0;
}
