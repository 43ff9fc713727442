// Fuzz target: the calibration reader (model::parse_calibration), its GPU type names resolved
// against a built-in cluster as the commands do. An accepted calibration is written back
// (model::write_calibration) and must read back equal.
#include "model/calibration.hpp"
#include "model/io.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string text = fuzz::text_of(data, size);
  static const model::Cluster cluster = model::builtin_cluster("hetpipe-testbed");
  const std::string file = "calibration.yaml";
  model::Calibration calibration;
  try {
    calibration = model::parse_calibration(text, file);
  } catch (const InputError& e) {
    fuzz::check_refusal(e, file, text);
    return 0;
  }
  FUZZ_CHECK(model::parse_calibration(model::write_calibration(calibration), "written.yaml") == calibration);
  try {
    (void)model::resolve_calibration(calibration, cluster, file);
  } catch (const InputError& e) {
    fuzz::check_refusal(e, file, text);
  }
  return 0;
}
