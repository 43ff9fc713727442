// hetflow export-launch: a plan as the frameworks' own launch flags and config keys, each
// derived here by hand from the plan options given, and what a framework cannot be told.
#include <gtest/gtest.h>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;

namespace {
// 8 decoder layers (10 network layers with the embedding and the head) on 4 DGX nodes.
const std::string kModel = "--cluster selene-4 --model gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=51200";
}  // namespace

// tensor 2 x pipeline 2 x data 8 = 32 GPUs = 4 nodes of 8; 64 samples of 1; full
// recomputation and sequence parallelism; 25 MiB buckets of fp16 gradients = 13,107,200.
TEST(ExportLaunch, MegatronFlagsForAUniformPlan) {
  const auto r = run_hetflow("export-launch --framework megatron " + kModel +
                             " --tensor 2 --pipeline 2 --data 8 --micro-batch 1 --global-batch 64 --recompute full "
                             "--sequence-parallel");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string body = r.out.substr(r.out.find('\n') + 1);
  EXPECT_EQ(body,
            "torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py \\\n"
            "    --tensor-model-parallel-size 2 \\\n"
            "    --pipeline-model-parallel-size 2 \\\n"
            "    --micro-batch-size 1 \\\n"
            "    --global-batch-size 64 \\\n"
            "    --num-layers 8 \\\n"
            "    --hidden-size 1024 \\\n"
            "    --num-attention-heads 16 \\\n"
            "    --seq-length 1024 \\\n"
            "    --max-position-embeddings 1024 \\\n"
            "    --fp16 \\\n"
            "    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \\\n"
            "    --sequence-parallel \\\n"
            "    --ddp-bucket-size 13107200\n"
            "\n"
            "megatron can be told everything this plan does.\n");
  EXPECT_EQ(r.out.find("# gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=51200 on selene-4: data 8 x pipeline 2 x "
                       "tensor 2, plan xxh3:"),
            0u)
      << r.out;
}

// --stage-layers 2,3,3,2 puts 1, 3, 3 and 1 decoder layers on the stages: Megatron says the
// first and last apart; 2,2,4,2 (1, 2, 4, 1) it cannot say; torchtitan splits anywhere.
TEST(ExportLaunch, UnevenStages) {
  const std::string plan = kModel + " --pipeline 4 --micro-batch 2 --global-batch 64 --stage-layers ";
  auto r = run_hetflow("export-launch --framework megatron " + plan + "2,3,3,2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("    --decoder-first-pipeline-num-layers 1 \\\n    --decoder-last-pipeline-num-layers 1 \\\n"),
            std::string::npos)
      << r.out;
  r = run_hetflow("export-launch --framework megatron " + plan + "2,2,4,2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("What the plan does that megatron cannot be told (launched as above, it runs without them):\n"
                       "  - stages of unequal sizes (1,2,4,1 layers): only the first and the last stage may differ from "
                       "the others\n"),
            std::string::npos)
      << r.out;
  r = run_hetflow("export-launch --framework torchtitan " + plan + "2,2,4,2 --precision bf16");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string body = r.out.substr(r.out.find('\n') + 1);
  EXPECT_EQ(body,
            "# hetflow.toml\n[training]\nlocal_batch_size = 8\nglobal_batch_size = 64\nseq_len = 1024\n"
            "mixed_precision_param = \"bfloat16\"\n\n[parallelism]\ndata_parallel_replicate_degree = 8\n"
            "data_parallel_shard_degree = 1\ntensor_parallel_degree = 1\npipeline_parallel_degree = 4\n"
            "pipeline_parallel_schedule = \"1F1B\"\npipeline_parallel_microbatch_size = 2\n"
            "pipeline_parallel_split_points = [\"layers.1\", \"layers.3\", \"layers.7\"]\n\n"
            "[activation_checkpoint]\nmode = \"none\"\n\n"
            "torchrun --nnodes 4 --nproc_per_node 8 -m torchtitan.train --job.config_file hetflow.toml\n\n"
            "torchtitan can be told everything this plan does.\n");
}

// HetPipe on four GPU types with WSP: DeepSpeed's config holds the batch (16 = 1 x 4 x 4),
// and the list says the rest plainly.
TEST(ExportLaunch, DeepSpeedSaysWhatItCannotExpress) {
  const auto r = run_hetflow(
      "export-launch --framework deepspeed --cluster hetpipe-testbed --model gpt2-124m --policy hetpipe-np "
      "--global-batch 16");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* says : {"  \"train_batch_size\": 16,\n  \"train_micro_batch_size_per_gpu\": 1,\n"
                           "  \"gradient_accumulation_steps\": 4,\n",
                           "deepspeed --num_nodes 4 --num_gpus 4 train.py --deepspeed --deepspeed_config ds_config.json\n",
                           "  - devices of different types (4 x Quadro-P4000, 4 x RTX-2060, 4 x TITAN-RTX, 4 x TITAN-V)",
                           "  - wave-synchronous parallelism (WSP, staleness 0): only synchronous steps\n"}) {
    EXPECT_NE(r.out.find(says), std::string::npos) << says << "\n" << r.out;
  }
}

TEST(ExportLaunch, BadFrameworkAndNetwork) {
  auto r = run_hetflow("export-launch --framework megatorn " + kModel);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "hetflow: <command line>: --framework: expected megatron, deepspeed or torchtitan, found 'megatorn'; "
                   "did you mean 'megatron'?\n");
  r = run_hetflow("export-launch --framework megatron --cluster hetpipe-testbed --model resnet50 --pipeline 4 --data 1");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err.find("hetflow: <command line>: --model: the network 'resnet50' is not a decoder"), 0u) << r.err;
}
