// Fuzz target: the cluster reader (model::parse_cluster, YAML or JSON). An accepted cluster
// is written back (model::write_cluster) and must read back equal.
#include "model/io.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string text = fuzz::text_of(data, size);
  const std::string file = "cluster.yaml";
  model::Cluster cluster;
  try {
    cluster = model::parse_cluster(text, file);
  } catch (const InputError& e) {
    fuzz::check_refusal(e, file, text);
    return 0;
  }
  FUZZ_CHECK(model::parse_cluster(model::write_cluster(cluster), "written.yaml") == cluster);
  return 0;
}
