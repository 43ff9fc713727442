// Fuzz target: the reliability section of a cluster file (campaign::parse_reliability). An
// accepted section gives finite, non-negative figures and positive MTBFs and bandwidths.
#include <cmath>

#include "campaign/reliability.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string text = fuzz::text_of(data, size);
  const std::string file = "cluster.yaml";
  campaign::Reliability r;
  try {
    r = campaign::parse_reliability(text, file);
  } catch (const InputError& e) {
    fuzz::check_refusal(e, file, text);
    return 0;
  }
  for (double mtbf : r.mtbf_s) FUZZ_CHECK(mtbf > 0 && std::isfinite(mtbf));
  for (double v : {r.detection_s, r.relaunch_s, r.comm_setup_s_per_rank, r.repair_s, r.spare_swap_s}) {
    FUZZ_CHECK(v >= 0 && std::isfinite(v));
  }
  for (double bw : {r.storage_node_bytes_per_s, r.storage_aggregate_bytes_per_s, r.host_copy_bytes_per_s}) {
    FUZZ_CHECK(bw > 0 && std::isfinite(bw));
  }
  FUZZ_CHECK(r.straggler_probability >= 0 && r.straggler_probability <= 1 && r.straggler_slowdown >= 1);
  return 0;
}
