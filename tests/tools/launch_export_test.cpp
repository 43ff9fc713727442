// tools/launch_export.hpp without the command line: a plan built here, its launch for each
// framework, each figure derived by hand from the options given.
#include "tools/launch_export.hpp"

#include <gtest/gtest.h>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"

namespace hetflow {
namespace {

// tensor 2 x pipeline 2 x data 4 = 16 GPUs of two DGX A100 nodes; 32 samples of 1.
partition::Plan plan_on_two_nodes(int tensor, int pipeline, int data) {
  const model::Cluster cluster = model::selene_cluster(2);
  const model::Network net =
      model::network_from_spec("gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=51200", model::Precision::fp16);
  partition::PlanOptions o;
  o.tensor = tensor;
  o.pipeline = pipeline;
  o.data = data;
  o.micro_batch = 1;
  o.global_batch = 32;
  o.precision = net.precision;
  const partition::CostModel cost(cluster, net.precision);
  partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
  plan.fingerprint = partition::plan_fingerprint(plan);
  return plan;
}

TEST(LaunchExport, TheGridIsThePlans) {
  const tools::Launch launch = tools::export_launch(plan_on_two_nodes(2, 2, 4), "megatron");
  EXPECT_EQ(launch.grid.tensor, 2);
  EXPECT_EQ(launch.grid.pipeline, 2);
  EXPECT_EQ(launch.grid.data, 4);
  EXPECT_EQ(launch.grid.nodes, 2);
  EXPECT_EQ(launch.grid.gpus_per_node, 8);
  EXPECT_EQ(launch.grid.global_batch, 32);
  EXPECT_EQ(launch.grid.microbatches, 8);  // 32 samples over 4 replicas, 1 a micro-batch
  EXPECT_EQ(launch.grid.chunk_layers, (std::vector<int>{4, 4}));
  EXPECT_TRUE(launch.grid.cannot.empty());
  EXPECT_EQ(launch.text.rfind("torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py \\\n", 0), 0u) << launch.text;
  EXPECT_NE(launch.text.find("    --tensor-model-parallel-size 2 \\\n    --pipeline-model-parallel-size 2 \\\n"),
            std::string::npos)
      << launch.text;
}

TEST(LaunchExport, EachFrameworkSaysTheSameGridInItsOwnWords) {
  const partition::Plan plan = plan_on_two_nodes(1, 2, 8);
  EXPECT_NE(tools::export_launch(plan, "deepspeed").text.find("\"train_batch_size\": 32"), std::string::npos);
  const std::string toml = tools::export_launch(plan, "torchtitan").text;
  EXPECT_NE(toml.find("pipeline_parallel_degree = 2"), std::string::npos) << toml;
  EXPECT_NE(toml.find("data_parallel_replicate_degree = 8"), std::string::npos) << toml;
}

TEST(LaunchExport, AnUnknownFrameworkIsAnError) {
  const partition::Plan plan = plan_on_two_nodes(1, 1, 16);
  EXPECT_THROW((void)tools::export_launch(plan, "jax"), Error);
  for (const std::string& f : tools::launch_frameworks()) EXPECT_NO_THROW((void)tools::export_launch(plan, f)) << f;
}

}  // namespace
}  // namespace hetflow
