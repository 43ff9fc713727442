// partition/plan.schema.json describes what write_plan_json writes, checked by an independent
// validator (Python's jsonschema, from Debian): plans of every kind conform, and a plan with a
// wrong field does not (the schema constrains, it does not just accept).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "tests/partition/plan_test_util.hpp"
#include "tests/scratch.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

const std::string kSchema = std::string(HETFLOW_SOURCE_DIR) + "/partition/plan.schema.json";

bool have_jsonschema() { return std::system("/usr/bin/python3 -c 'import jsonschema' >/dev/null 2>&1") == 0; }

// Exit status of validating `text` against the schema (0: conforms).
int schema_check(const std::string& text, const std::string& name) {
  const std::string path = (test_support::scratch_dir() / name).string();
  std::ofstream(path) << text;
  const std::string command = "/usr/bin/python3 -c 'import json, sys, jsonschema; "
                              "jsonschema.validate(json.load(open(sys.argv[2])), json.load(open(sys.argv[1])))' " +
                              kSchema + " " + path + " >/dev/null 2>&1";
  return std::system(command.c_str());
}

using test_support::plan_of;

}  // namespace

TEST(PlanSchema, WrittenPlansConformAndBrokenOnesDoNot) {
  if (!have_jsonschema()) GTEST_SKIP() << "python3-jsonschema is not installed (tools/install-deps.sh installs it)";
  PlanOptions tp;
  tp.tensor = 2;
  tp.sequence_parallel = true;
  tp.pipeline = 2;
  tp.microbatches = 2;
  tp.recompute = Recompute::full;
  const std::string gpt = write_plan_json(plan_of(
      test_support::identical_cluster(8), model::network_from_spec("gpt:layers=4,hidden=512,heads=8,seq=256", model::Precision::bf16), tp));
  EXPECT_EQ(schema_check(gpt, "gpt.json"), 0);
  PlanOptions wsp;
  wsp.policy = "hetpipe-ed";
  wsp.staleness = 1;
  wsp.microbatches = 2;
  wsp.iterations = 3;
  wsp.kernels.flash_attention = true;  // written only when not Megatron's defaults
  wsp.kernels.fused_bias_gelu = false;
  wsp.kernels.fused_adam = false;  // the one kernels field written only when off
  const std::string hetpipe = write_plan_json(
      plan_of(model::builtin_cluster("hetpipe-testbed"), model::network_from_spec("resnet50", model::Precision::fp16), wsp));
  EXPECT_EQ(schema_check(hetpipe, "hetpipe.json"), 0);
  PlanOptions overlap;  // order edges with a fourth number, the part of the backward waited for
  overlap.pipeline = 2;
  overlap.data = 2;
  overlap.microbatches = 2;
  overlap.bucket_bytes = 1 << 20;
  overlap.overlap_grad_reduce = true;
  const std::string overlapped = write_plan_json(plan_of(
      test_support::identical_cluster(4), model::network_from_spec("gpt:layers=4,hidden=512,heads=8,seq=256", model::Precision::bf16),
      overlap));
  ASSERT_NE(overlapped.find("\"overlap_grad_reduce\""), std::string::npos);
  EXPECT_EQ(schema_check(overlapped, "overlapped.json"), 0);
  overlap.axis_order = "pipeline,tensor,data";  // a placement order not Megatron's: the layout's axes by name
  const std::string placed = write_plan_json(plan_of(
      test_support::identical_cluster(4), model::network_from_spec("gpt:layers=4,hidden=512,heads=8,seq=256", model::Precision::bf16),
      overlap));
  ASSERT_NE(placed.find("\"axes\":[{\"axis\":\"pipeline\""), std::string::npos);
  EXPECT_EQ(schema_check(placed, "placed.json"), 0);
  PlanOptions offload;  // offload's task kinds, host_state tensors, host_bytes and layout.offload
  offload.data = 2;
  offload.zero_stage = 1;
  offload.offload_optimizer = true;
  const std::string offloaded = write_plan_json(plan_of(
      test_support::identical_cluster(2), model::network_from_spec("gpt:layers=2,hidden=256,heads=4,seq=128", model::Precision::bf16),
      offload));
  ASSERT_NE(offloaded.find("\"host_optimizer\""), std::string::npos);
  ASSERT_NE(offloaded.find("\"host_bytes\""), std::string::npos);
  EXPECT_EQ(schema_check(offloaded, "offloaded.json"), 0);
  PlanOptions ring;  // a context group's ring: sendrecv collectives whose messages overlap ("until")
  ring.context = 2;
  ring.context_comm = ContextComm::ring;
  ring.microbatches = 2;
  const std::string ringed = write_plan_json(plan_of(
      test_support::identical_cluster(2),
      model::network_from_spec("llama:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=1000,seq=256", model::Precision::bf16), ring));
  ASSERT_NE(ringed.find("\"sendrecv\""), std::string::npos);
  ASSERT_NE(ringed.find("\"until\""), std::string::npos);
  EXPECT_EQ(schema_check(ringed, "ring.json"), 0);
  std::string both = placed;  // the tensor degree beside the axes would say it twice
  both.replace(both.find("\"axes\":[{"), 9, "\"tensor\":1,\"axes\":[{");
  EXPECT_NE(schema_check(both, "both.json"), 0);
  std::string whole = overlapped;  // a fraction of 1 is written as none
  const size_t part = whole.find(", 0.", whole.find("\"order\""));
  ASSERT_NE(part, std::string::npos);
  whole.replace(part, 4, ", 1.");
  EXPECT_NE(schema_check(whole, "whole.json"), 0);
  std::string broken = gpt;
  broken.replace(broken.find("\"kind\": \"forward\""), 17, "\"kind\": \"sideways\"");
  EXPECT_NE(schema_check(broken, "broken.json"), 0);
  std::string negative = gpt;
  negative.replace(negative.find("\"iterations\":1"), 14, "\"iterations\":0");
  EXPECT_NE(schema_check(negative, "negative.json"), 0);
}
