// The hetflow command as a user types it: help, list, describe, and their --json forms.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <sstream>

#include "model/error.hpp"
#include "tests/tools/run_hetflow.hpp"
#include "tools/cli.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;

TEST(Cli, HelpListsCommands) {
  const auto r = run_hetflow("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("describe"), std::string::npos);
  EXPECT_NE(r.out.find("--json"), std::string::npos);
  EXPECT_EQ(run_hetflow("describe --help").status, 0);
}

TEST(Cli, DescribeDefaultsPrintsTables) {
  const auto r = run_hetflow("describe");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("cluster mixed-academic"), std::string::npos);
  EXPECT_NE(r.out.find("network gpt2-xl"), std::string::npos);
  EXPECT_NE(r.out.find("link classes"), std::string::npos);
}

TEST(Cli, DescribeJsonIsOneObjectWithUnits) {
  const auto r = run_hetflow("describe --cluster dgx-a100-x4 --model gpt3-175b --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["cluster"]["devices"], 32);
  EXPECT_DOUBLE_EQ(j["cluster"]["peak_fp16_flops_per_s"].get<double>(), 32 * 312e12);
  EXPECT_NEAR(j["network"]["params"].get<double>() / 175e9, 1.0, 0.01);
  EXPECT_DOUBLE_EQ(j["network"]["weights_grads_adam_bytes"].get<double>(),
                   16 * j["network"]["params"].get<double>());
}

TEST(Cli, ListJsonNamesEveryPreset) {
  const auto r = run_hetflow("list --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["clusters"].size(), 7u);  // five GPU clusters, cpu-4 (cpu-N) and selene-4 (selene-N)
  EXPECT_EQ(j["clusters"][4]["name"], "cpu-4");
  EXPECT_EQ(j["clusters"][5]["name"], "selene-4");
  EXPECT_GE(j["gpus"].size(), 17u);
  EXPECT_EQ(j["default_cluster"], "mixed-academic");
}

TEST(Cli, VersionSaysWhichBuildThisIs) {
  for (const char* ask : {"--version", "version"}) {
    const auto r = run_hetflow(ask);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out.rfind("hetflow 0.", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("plan format 3"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("SimGrid 3."), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("CUDA "), std::string::npos) << r.out;
  }
}

// The cluster files the README's search examples read are shipped, and read.
TEST(Cli, TheReadmesExampleClustersRead) {
  for (const char* name : {"v100-t4", "priced-v100-t4", "a100x8", "v100-3090"}) {
    const auto r = run_hetflow(std::string("describe --cluster " HETFLOW_SOURCE_DIR "/tools/examples/") + name +
                               ".yaml");
    ASSERT_EQ(r.status, 0) << name << "\n" << r.err;
    EXPECT_NE(r.out.find(std::string("cluster ") + name + ": "), std::string::npos) << r.out;
  }
}

// A config.json's settings the layers leave out, as describe says them (text and --json);
// a network without any has no such line or key.
TEST(Cli, DescribeSaysWhatAConfigAsksForThatIsNotModelled) {
  const auto config = scratch_dir() / "config.json";
  std::ofstream(config) << R"({"model_type": "mistral", "hidden_size": 64, "intermediate_size": 96,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 32768,
    "sliding_window": 4096, "hidden_act": "gelu"})";
  const auto text = run_hetflow("describe --model " + config.string());
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("not modelled          hidden_act gelu"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("attention             sliding window of 4096 keys per query"), std::string::npos) << text.out;
  const auto json = run_hetflow("describe --model " + config.string() + " --json");
  ASSERT_EQ(json.status, 0) << json.err;
  EXPECT_EQ(nlohmann::json::parse(json.out)["network"]["unmodelled"], "hidden_act gelu");
  EXPECT_EQ(nlohmann::json::parse(json.out)["network"]["sliding_window"], 4096);
  const auto plain = run_hetflow("describe --model llama2-7b --json");
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_FALSE(nlohmann::json::parse(plain.out)["network"].contains("unmodelled"));
  EXPECT_FALSE(nlohmann::json::parse(plain.out)["network"].contains("rope_scaling"));
}

// Qwen3's attention as describe says it (text and --json), and as run's report does.
TEST(Cli, DescribeAndRunSayTheHeadSizeAndQkNorm) {
  const std::string config = HETFLOW_SOURCE_DIR "/tests/exec/oracle/qwen3_odd.json";
  const auto text = run_hetflow("describe --model " + config);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("attention             6 heads of 10 (q 60 wide, hidden 48); QK-norm\n"), std::string::npos)
      << text.out;
  const auto json = run_hetflow("describe --model " + config + " --json");
  ASSERT_EQ(json.status, 0) << json.err;
  EXPECT_EQ(nlohmann::json::parse(json.out)["network"]["head_dim"], 10);
  EXPECT_EQ(nlohmann::json::parse(json.out)["network"]["qk_norm"], true);
  const auto plain = run_hetflow("describe --model llama2-7b --json");
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(nlohmann::json::parse(plain.out)["network"]["head_dim"], 128);
  EXPECT_FALSE(nlohmann::json::parse(plain.out)["network"].contains("qk_norm"));
  const auto run = run_hetflow("run --model " + config + " --cluster cpu-2 --tensor 2 --steps 1 --precision fp32");
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.out.find("6 heads of 10 (2 key/value), QK-norm"), std::string::npos) << run.out;
}

// --seq-length: the same model at another number of tokens per sample. A learned position
// table keeps its rows (GPT-2's 1024, so its parameters stay the checkpoint's), and cannot
// be run past them; a network not built from an architecture has no such choice.
TEST(Cli, SeqLengthRunsTheModelAtOtherSequences) {
  const auto json_of = [](const std::string& args) {
    const auto r = run_hetflow("describe " + args + " --json");
    EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
    return r.status == 0 ? nlohmann::json::parse(r.out)["network"] : nlohmann::json();
  };
  const auto gpt2 = json_of("--model gpt2-124m"), short_gpt2 = json_of("--model gpt2-124m --seq-length 256");
  EXPECT_EQ(short_gpt2["tokens_per_sample"], 256);
  EXPECT_EQ(short_gpt2["params"], gpt2["params"]);  // 124,439,808: wpe keeps its 1024 rows
  EXPECT_LT(short_gpt2["training_flops_per_sample"].get<double>(), gpt2["training_flops_per_sample"].get<double>() / 4);
  const auto qwen = json_of("--model qwen3-0.6b"), long_qwen = json_of("--model qwen3-0.6b --seq-length 32768");
  EXPECT_EQ(long_qwen["tokens_per_sample"], 32768);
  EXPECT_EQ(long_qwen["params"], qwen["params"]);
  // The plan file carries it: the position table's rows and the sequence.
  const auto dir = scratch_dir();
  const std::string plan = (dir / "short_gpt2.json").string();
  ASSERT_EQ(run_hetflow("plan --cluster cpu-2 --model gpt2-124m --seq-length 256 --out " + plan).status, 0);
  EXPECT_NE(hetflow::test_support::slurp(plan).find("positions: 1024"), std::string::npos);
  for (const auto& [args, says] :
       {std::pair{std::string("--model gpt2-124m --seq-length 2048"),
                  "--seq-length: expected at most the 1024 positions the learned table has, found 2048"},
        std::pair{std::string("--model resnet50 --seq-length 8"), "--seq-length: the network 'resnet50' is not a transformer"},
        std::pair{std::string("--model gpt2-124m --seq-length 0"), "--seq-length: expected a whole number between 1 and"}}) {
    const auto r = run_hetflow("describe " + args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_NE(r.err.find(says), std::string::npos) << args << "\n" << r.err;
  }
}

// Llama 3.2's RoPE scaling, as describe says it: the factor and the wavelength bands
// (original context 8192 / low_freq_factor 1 and / high_freq_factor 4).
TEST(Cli, DescribeSaysTheRopeScaling) {
  const std::string config = HETFLOW_SOURCE_DIR "/tests/fuzz/corpus/hf_config/llama32_rope_scaling.json";
  const auto text = run_hetflow("describe --model " + config);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("rotary positions      theta 500000, llama3 scaling x32 of wavelengths above 8192 "
                          "positions, blended down to 2048\n"),
            std::string::npos)
      << text.out;
  EXPECT_EQ(text.out.find("not modelled"), std::string::npos) << text.out;
  const auto json = run_hetflow("describe --model " + config + " --json");
  ASSERT_EQ(json.status, 0) << json.err;
  EXPECT_EQ(nlohmann::json::parse(json.out)["network"]["rope_scaling"],
            nlohmann::json::parse(R"({"type": "llama3", "factor": 32, "low_freq_factor": 1, "high_freq_factor": 4,
                                      "original_positions": 8192})"));
  // Qwen3-30B-A3B with its model card's YaRN: the ramp's wavelengths are the original context
  // over beta_slow 1 and beta_fast 32; cos and sin x (0.1 ln 4 + 1).
  const std::string qwen = HETFLOW_SOURCE_DIR "/tests/fuzz/corpus/hf_config/qwen3_moe_yarn.json";
  const auto yarn = run_hetflow("describe --model " + qwen);
  ASSERT_EQ(yarn.status, 0) << yarn.err;
  EXPECT_NE(yarn.out.find("rotary positions      theta 1000000, yarn scaling x4 of wavelengths above 32768 positions, "
                          "ramped down to 1024 (in whole pairs), cos and sin x1.139\n"),
            std::string::npos)
      << yarn.out;
  EXPECT_EQ(yarn.out.find("not modelled"), std::string::npos) << yarn.out;
  const auto yarn_json = run_hetflow("describe --model " + qwen + " --json");
  ASSERT_EQ(yarn_json.status, 0) << yarn_json.err;
  nlohmann::json scaling = nlohmann::json::parse(yarn_json.out)["network"]["rope_scaling"];
  EXPECT_NEAR(scaling["attention_factor"].get<double>(), 0.1 * std::log(4.0) + 1, 1e-15);
  scaling.erase("attention_factor");
  EXPECT_EQ(scaling, nlohmann::json::parse(R"({"type": "yarn", "factor": 4, "original_positions": 32768,
                                               "beta_fast": 32, "beta_slow": 1, "truncate": true})"));
}

// Linking cuBLAS made every process ~200 MiB resident before main, only for GPU GEMMs
// (kernels/cublas_loader.hpp). Simulating or training on the CPU must never open it; the
// dynamic loader's own log (LD_DEBUG=files) names every library a process opens, linked or not.
TEST(Cli, NothingButAGpuGemmOpensCublas) {
  const std::string model = "--model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256";
  for (const std::string& args : {std::string("--version"), "simulate --cluster cpu-2 " + model + " --iterations 1",
                                  "run --cluster cpu-2 " + model + " --workspace 0 --steps 1"}) {
    const auto r = run_hetflow(args, "LD_DEBUG=files");
    ASSERT_EQ(r.status, 0) << args << "\n" << r.err;
    ASSERT_NE(r.err.find("file=libc.so.6"), std::string::npos) << "no loader log: LD_DEBUG is not glibc's here?";
    EXPECT_EQ(r.err.find("libcublas"), std::string::npos) << args << " opened cuBLAS";
    EXPECT_EQ(r.err.find("libcublasLt"), std::string::npos) << args << " opened cuBLASLt";
  }
}

// Found while fuzzing the command line: Boost.Program_options drops arguments that are not
// options when the command takes none, so `hetflow plan 4` planned as if the 4 were absent.
TEST(Cli, StrayArgumentsAreRefused) {
  for (const char* args : {"list extra", "describe gpt2-xl", "plan 4", "simulate -- x", "validate a.json b.json"}) {
    const auto r = run_hetflow(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("too many positional options"), std::string::npos) << args << "\n" << r.err;
  }
}

// The command line read as the commands read it, without running them (the fuzz target's
// entry point): the values the commands check are checked, files are not opened.
TEST(Cli, ReadCommandLineChecksOptionsWithoutRunning) {
  using hetflow::tools::read_command_line;
  std::ostringstream out;
  // simulate runs 3 iterations unless told otherwise, after a `--` too (it ran 1 before).
  for (const std::vector<std::string>& args : {std::vector<std::string>{"simulate", "--pipeline", "2"},
                                              std::vector<std::string>{"simulate", "--pipeline", "2", "--"}}) {
    const auto line = read_command_line(args, out);
    EXPECT_EQ(line.vm["iterations"].as<int>(), 3);
  }
  EXPECT_EQ(read_command_line({"simulate", "--iterations", "5"}, out).vm["iterations"].as<int>(), 5);
  EXPECT_EQ(read_command_line({"validate", "no-such-file.json"}, out).vm["plan"].as<std::string>(), "no-such-file.json");
  EXPECT_TRUE(read_command_line({"plan", "--help"}, out).help);
  EXPECT_NE(out.str().find("usage: hetflow plan"), std::string::npos);
  auto error_of = [&](const std::vector<std::string>& args) -> std::string {
    try {
      read_command_line(args, out);
    } catch (const hetflow::InputError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of({}).find("expected a command"), std::string::npos);
  EXPECT_NE(error_of({"plot"}).find("unknown command 'plot'"), std::string::npos);
  EXPECT_NE(error_of({"plan", "--workspace", "-1 GiB"}).find("--workspace"), std::string::npos);
  EXPECT_NE(error_of({"simulate", "--stage-layers", "7,x"}).find("--stage-layers"), std::string::npos);
  EXPECT_NE(error_of({"describe", "--precision", "fp8"}).find("--precision"), std::string::npos);
  EXPECT_NE(error_of({"simulate", "--max-tasks", "0"}).find("--max-tasks"), std::string::npos);
}

// Found by fuzzing the command line (tests/fuzz/cli_fuzz.cpp): Boost.Program_options' error
// message for `--pipeline "%value%"` replaced the placeholder with a value holding it again,
// forever (hetflow hung, its memory growing). Such arguments are refused up front.
TEST(Cli, ArgumentsHoldingBoostPlaceholdersAreRefused) {
  for (const char* args : {"plan --pipeline %value%", "simulate --pipeline 'argument (%value%)'",
                           "describe --%option%", "list %original_token%", "validate --plan x%canonical_option%"}) {
    const auto r = run_hetflow(args, "timeout 60");  // it hung before
    EXPECT_EQ(r.status, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("which the option parser cannot quote"), std::string::npos) << args << "\n" << r.err;
  }
}

// Every report's error and change columns: a figure against its reference, and nothing
// to compare with said as "-" (null in --json), never as "+0.0 %".
TEST(Cli, ARelativeErrorWithoutAReferenceIsADash) {
  using hetflow::tools::relative_error;
  using hetflow::tools::signed_percent;
  EXPECT_DOUBLE_EQ(relative_error(1.5, 1.0), 0.5);
  EXPECT_DOUBLE_EQ(relative_error(0.5, 2.0), -0.75);
  EXPECT_EQ(relative_error(0, 0), 0);
  EXPECT_TRUE(std::isnan(relative_error(3.0, 0)));
  EXPECT_EQ(signed_percent(0.1234), "+12.3 %");
  EXPECT_EQ(signed_percent(-0.05, 2), "-5.00 %");
  EXPECT_EQ(signed_percent(0), "+0.0 %");
  EXPECT_EQ(signed_percent(relative_error(3.0, 0)), "-");
  EXPECT_EQ(hetflow::tools::Json(relative_error(3.0, 0)).dump(), "null");
}
