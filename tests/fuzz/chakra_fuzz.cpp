// Fuzz target: the Chakra execution-trace reader (traces::read_chakra). The input holds
// several files: rank files separated by "\nRANK--\n", then optionally "\nGROUP-\n" and a
// comm_group.json. An accepted workload must validate or be refused by validation (a plan
// error, never a crash), and a valid one must write back and read again as the same work:
// the same tasks, and the same collectives with the same in-task points (a pass is written
// in parts with its in-task messages between them, and joined back).
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "model/io.hpp"
#include "partition/cost_model.hpp"
#include "partition/validate.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "traces/chakra.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string text = fuzz::text_of(data, size);
  const std::string group_marker = "\nGROUP-\n", rank_marker = "\nRANK--\n";
  const size_t group_at = text.find(group_marker);
  const std::string files = text.substr(0, group_at);
  const std::string group = group_at == std::string::npos ? "" : text.substr(group_at + group_marker.size());
  std::vector<traces::ChakraFile> ranks;
  for (size_t at = 0; ranks.size() < 8;) {
    const size_t next = files.find(rank_marker, at);
    ranks.push_back({"fuzz/r." + std::to_string(ranks.size()) + ".et", files.substr(at, next - at)});
    if (next == std::string::npos) break;
    at = next + rank_marker.size();
  }
  static const model::Cluster cluster = model::cpu_cluster(8);
  partition::Plan plan;
  try {
    plan = traces::read_chakra(ranks, group, cluster, "fuzz");
  } catch (const InputError& e) {
    fuzz::check_refusal(e, "fuzz", text);
    return 0;
  }
  if (!partition::validate_plan(plan).ok()) return 0;
  const partition::CostModel cost(plan.cluster, plan.layout.precision);
  std::vector<traces::ChakraFile> written = traces::write_chakra(plan, cost, "again");
  const std::string written_group = written.back().bytes;
  written.pop_back();
  written.resize(ranks.size());  // devices past the last rank have no tasks, and no file to read
  const partition::Plan back = traces::read_chakra(written, written_group, cluster, "again");
  FUZZ_CHECK(back.tasks.size() == plan.tasks.size());
  FUZZ_CHECK(back.collectives.size() == plan.collectives.size());
  std::multiset<std::tuple<int, int, double, double>> work, back_work;  // (device, kind, flops, bytes)
  for (const partition::Task& t : plan.tasks) work.insert({t.device, static_cast<int>(t.kind), t.flops, t.bytes});
  for (const partition::Task& t : back.tasks) back_work.insert({t.device, static_cast<int>(t.kind), t.flops, t.bytes});
  FUZZ_CHECK(work == back_work);
  std::multiset<std::vector<double>> points, back_points;
  for (const partition::Collective& c : plan.collectives) points.insert(c.at);
  for (const partition::Collective& c : back.collectives) back_points.insert(c.at);
  FUZZ_CHECK(points == back_points);
  return 0;
}
