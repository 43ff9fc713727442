// The calibration: its efficiency curve against hand computation, per-kind fallbacks, the
// file's round trip and errors, and link factors applied to every link of a class.
#include "model/calibration.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>

#include "model/cluster.hpp"
#include "model/error.hpp"
#include "model/io.hpp"

using namespace hetflow::model;

TEST(Calibration, TheCurveRisesToItsMaximumAndAddsTheOverhead) {
  const Efficiency flat{0.5, 0, 1e-3};
  EXPECT_DOUBLE_EQ(flat.efficiency(1), 0.5);
  EXPECT_DOUBLE_EQ(flat.time_s(2e9, 1e12), 1e-3 + 2e9 / (1e12 * 0.5));
  EXPECT_EQ(flat.time_s(0, 1e12), 0);  // no work, no task

  const Efficiency curve{0.8, 1e9, 10e-6};
  // At F = S: 1 - 1/e of the maximum; far above it, the maximum.
  EXPECT_NEAR(curve.efficiency(1e9), 0.8 * (1 - std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(curve.efficiency(1e12), 0.8, 1e-12);
  // A tiny task costs about filling the device once: S / (P max).
  EXPECT_NEAR(curve.math_s(1, 1e12), 1e9 / (1e12 * 0.8), 1e-9);
  EXPECT_NEAR(curve.time_s(3e9, 1e12), 10e-6 + 3e9 / (1e12 * 0.8 * (1 - std::exp(-3.0))), 1e-15);
}

TEST(Calibration, AKindFallsBackToItsGpuTypeAndMissingFieldsAreTheTypes) {
  const Calibration c = parse_calibration(
      "gpus: {A100-80: {max_efficiency: 0.7, saturation_flops: 1e9, overhead: 5 us, dispatch: 2 us,\n"
      "                 kinds: {backward: {max_efficiency: 0.6}}}}\n",
      "cal.yaml");
  const GpuEfficiency& g = c.gpu("A100-80");
  EXPECT_DOUBLE_EQ(g.dispatch_s, 2e-6);
  EXPECT_EQ(&g.of("forward"), static_cast<const Efficiency*>(&g));
  EXPECT_DOUBLE_EQ(g.of("backward").max_efficiency, 0.6);
  EXPECT_DOUBLE_EQ(g.of("backward").saturation_flops, 1e9);  // the type's
  EXPECT_DOUBLE_EQ(g.of("backward").overhead_s, 5e-6);
  EXPECT_DOUBLE_EQ(c.gpu("V100-16").max_efficiency, 0.6);  // not given: the default
}

TEST(Calibration, WritesWhatItReads) {
  Calibration c;
  c.default_gpu.max_efficiency = 0.55;
  GpuEfficiency g;
  g.max_efficiency = 0.6999999999999997;
  g.saturation_flops = 20000000.00000005;
  g.overhead_s = 50.000000001004e-6;
  g.dispatch_s = 37.3e-6;
  g.kinds["backward"] = Efficiency{0.5000000000000036, 49999999.999999285, 80.00000000006798e-6};
  g.kinds["optimizer"] = Efficiency{0.15, 0, 1e-3};
  g.ops["gemm"] = OpEfficiency{0.8100000000000003, 3.3e10, 4.5e-6};
  g.ops["memory"] = OpEfficiency{0.85, 1e7, 0};
  c.gpus["CPU"] = g;
  c.links["pcie"] = LinkCalibration{0.29423573956578997, 25.736221360836765};
  const std::string text = write_calibration(c);
  EXPECT_EQ(parse_calibration(text, "round.yaml"), c) << text;
}

// Operation costs: a missing class falls back (attention as gemm, gemm as the type's curve,
// memory at 0.8 of the bandwidth); the formula by hand.
TEST(Calibration, OperationClassesAndTheirFallbacks) {
  const Calibration c = parse_calibration(
      "gpus: {A100-80: {max_efficiency: 0.7, saturation_flops: 1e9, ops: {gemm: {max_efficiency: 0.8, launch: 5 us}}}}\n",
      "cal.yaml");
  const GpuEfficiency& g = c.gpu("A100-80");
  EXPECT_DOUBLE_EQ(g.op("gemm").max_efficiency, 0.8);
  EXPECT_DOUBLE_EQ(g.op("gemm").saturation, 1e9);  // the type's, where the class does not say
  EXPECT_DOUBLE_EQ(g.op("attention").max_efficiency, 0.8);
  EXPECT_DOUBLE_EQ(g.op("memory").max_efficiency, 0.8);
  EXPECT_DOUBLE_EQ(g.op("gemm").time_s(2e12, 312e12), 5e-6 + 2e12 / (312e12 * 0.8 * -std::expm1(-2e12 / 1e9)));
  EXPECT_EQ(g.op("gemm").time_s(0, 312e12), 0);
  EXPECT_TRUE(c.gpu("V100-16").ops.empty());
}

TEST(Calibration, RefusesUnknownKindsAndBadCurves) {
  auto error_of = [](const std::string& yaml) {
    try {
      parse_calibration(yaml, "cal.yaml");
    } catch (const hetflow::InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of("gpus: {A100-80: {kinds: {send: {max_efficiency: 0.5}}}}\n").find(
                "gpus.A100-80.kinds.send: expected a compute task kind"),
            std::string::npos);
  EXPECT_NE(error_of("gpus: {A100-80: {saturation_flops: -1}}\n").find("gpus.A100-80.saturation_flops"),
            std::string::npos);
  EXPECT_NE(error_of("gpus: {A100-80: {kinds: {forward: {max_efficency: 0.5}}}}\n").find("max_efficency"),
            std::string::npos);
  EXPECT_NE(error_of("gpus: {A100-80: {dispatch: 2 parsecs}}\n").find("gpus.A100-80.dispatch"), std::string::npos);
  EXPECT_NE(error_of("gpus: {A100-80: {ops: {conv: {max_efficiency: 0.5}}}}\n").find(
                "gpus.A100-80.ops.conv: expected an operation class"),
            std::string::npos);
  EXPECT_NE(error_of("gpus: {A100-80: {ops: {gemm: {max_efficiency: 1.5}}}}\n").find("gpus.A100-80.ops.gemm.max_efficiency"),
            std::string::npos);
}

TEST(Calibration, LinkFactorsScaleEveryLinkOfTheirClass) {
  const Cluster cluster = builtin_cluster("mixed-academic");
  Calibration c;
  c.links["nic"] = LinkCalibration{0.5, 3};
  const Cluster scaled = apply_link_calibration(cluster, c);
  for (size_t n = 0; n < cluster.nodes.size(); ++n) {
    EXPECT_DOUBLE_EQ(scaled.nodes[n].nic.bandwidth_bytes_per_s, 0.5 * cluster.nodes[n].nic.bandwidth_bytes_per_s);
    EXPECT_DOUBLE_EQ(scaled.nodes[n].nic.latency_s, 3 * cluster.nodes[n].nic.latency_s);
    EXPECT_EQ(scaled.nodes[n].intra, cluster.nodes[n].intra);  // other classes untouched
  }
}

// Wave quantization by hand, on NVIDIA's example (Matrix Multiplication Background guide: an
// A100's 108 SMs, 256 x 128 tiles, M = 2304): N = 1536 makes 9 x 12 = 108 tiles, one full
// wave; N = 1664 makes 9 x 13 = 117, two waves of which the second holds 9 tiles, so the
// device is busy 2304 x 1664 / (2 x 108 x 256 x 128) of the time. A batch adds its tiles to
// the waves. A GEMM of one wave or less is not charged (split k or smaller tiles fill the
// device; a padded 300 x 300 pays once it has more tiles than SMs); no waves, none either.
TEST(OpEfficiency, WaveQuantizationByHand) {
  OpEfficiency e;
  e.sms = 108;
  e.tile_m = 256;
  e.tile_n = 128;
  EXPECT_DOUBLE_EQ(e.utilization(2304, 1536), 1.0);
  EXPECT_DOUBLE_EQ(e.utilization(2304, 1664), 2304.0 * 1664 / (2 * 108 * 256 * 128));
  EXPECT_DOUBLE_EQ(e.utilization(1664, 2304), e.utilization(2304, 1664));  // either orientation
  // 32 score matrices of 2048 x 2048: 8 x 16 x 32 = 4096 tiles in 38 waves.
  EXPECT_DOUBLE_EQ(e.utilization(2048, 2048, 32), 4096.0 / (38 * 108));
  EXPECT_DOUBLE_EQ(e.utilization(100, 100), 1.0);
  // 300 x 300 in a batch of 40: 2 x 3 x 40 = 240 tiles in 3 waves, each tile 300^2 / (512 x 384) full.
  EXPECT_DOUBLE_EQ(e.utilization(300, 300, 40), 300.0 * 300 / (512 * 384) * 240 / (3 * 108));
  EXPECT_DOUBLE_EQ(OpEfficiency{}.utilization(100, 100), 1.0);
  EXPECT_DOUBLE_EQ(e.utilization(0, 100), 1.0);  // nothing to tile: no penalty
}

TEST(OpEfficiency, WavesReadBackAndAreRefusedWhereTheyCannotApply) {
  const Calibration c = parse_calibration(
      "gpus: {A100-80: {ops: {gemm: {max_efficiency: 0.7, waves: {sms: 108, tile_m: 256, tile_n: 128}},"
      " attention: {launch: 3 us}}}}\n",
      "w.yaml");
  const OpEfficiency& gemm = c.gpus.at("A100-80").ops.at("gemm");
  // Attention takes gemm's curve where it gives none, but not its tiles.
  EXPECT_EQ(c.gpus.at("A100-80").ops.at("attention").max_efficiency, 0.7);
  EXPECT_EQ(c.gpus.at("A100-80").ops.at("attention").sms, 0);
  EXPECT_EQ(gemm.sms, 108);
  EXPECT_EQ(gemm.tile_m, 256);
  EXPECT_EQ(gemm.tile_n, 128);
  EXPECT_EQ(parse_calibration(write_calibration(c), "again.yaml"), c);
  const std::pair<const char*, const char*> bad[] = {
      {"gpus: {A100-80: {ops: {memory: {waves: {sms: 108, tile_m: 256, tile_n: 128}}}}}", "gpus.A100-80.ops.memory.waves"},
      {"gpus: {A100-80: {ops: {attention: {waves: {sms: 108, tile_m: 256, tile_n: 128}}}}}", "gpus.A100-80.ops.attention.waves"},
      {"gpus: {A100-80: {ops: {gemm: {waves: {sms: 0, tile_m: 256, tile_n: 128}}}}}", "gpus.A100-80.ops.gemm.waves.sms"},
      {"gpus: {A100-80: {ops: {gemm: {waves: {sms: 108, tile_m: 256}}}}}", "gpus.A100-80.ops.gemm.waves.tile_n"},
      {"gpus: {A100-80: {ops: {gemm: {waves: {sms: 108, tile_m: 256, tile_n: 128, tile_k: 32}}}}}",
       "gpus.A100-80.ops.gemm.waves.tile_k"},
  };
  for (const auto& [text, field] : bad) {
    try {
      (void)parse_calibration(text, "bad.yaml");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const hetflow::InputError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

// The published calibrations: each reads, names built-in GPU types only, keeps its
// efficiencies and factors within (0, 1], and every value it sets has a source cited in the
// comment above it (or says it is an assumption or an inference).
TEST(PublishedCalibration, EachReadsAndCitesASourceForEveryValue) {
  ASSERT_GE(published_calibrations().size(), 3U);
  const Cluster cluster = builtin_cluster("selene-1");
  for (const PublishedCalibration& p : published_calibrations()) {
    SCOPED_TRACE(std::string(p.name));
    const Calibration c = load_calibration("published:" + std::string(p.name));
    EXPECT_NO_THROW((void)resolve_calibration(c, cluster, std::string(p.name)));
    EXPECT_FALSE(c.gpus.empty());
    for (const auto& [type, gpu] : c.gpus) {
      for (const auto& [op, e] : gpu.ops) {
        EXPECT_GT(e.max_efficiency, 0.5) << type << " " << op;
        EXPECT_LE(e.max_efficiency, 1.0) << type << " " << op;
      }
    }
    for (const auto& [link, f] : c.links) {
      EXPECT_GT(f.bandwidth_factor, 0.5) << link;
      EXPECT_LE(f.bandwidth_factor, 1.0) << link;
    }
    // Every line that sets a number: the comment block just above it cites where it is from.
    std::istringstream lines{std::string(p.yaml)};
    std::string line, comments;
    int values = 0;
    while (std::getline(lines, line)) {
      const auto first = line.find_first_not_of(' ');
      if (first == std::string::npos) continue;
      if (line[first] == '#') {
        comments += line + "\n";
        continue;
      }
      const bool sets_value = line.find("efficiency:") != std::string::npos || line.find("factor:") != std::string::npos ||
                              line.find("overhead:") != std::string::npos || line.find("launch:") != std::string::npos ||
                              line.find("saturation") != std::string::npos || line.find('*') != std::string::npos;
      if (sets_value) {
        ++values;
        const bool cited = comments.find("github.com/") != std::string::npos || comments.find("forums.") != std::string::npos ||
                           comments.find("docs.") != std::string::npos || comments.find("assumption") != std::string::npos ||
                           comments.find("inference") != std::string::npos;
        EXPECT_TRUE(cited) << "no source above: " << line;
      }
      comments.clear();
    }
    EXPECT_GT(values, 2);
  }
}

TEST(PublishedCalibration, AnUnknownNameListsThePublishedOnes) {
  try {
    (void)load_calibration("published:tpu");
    FAIL() << "expected an InputError";
  } catch (const hetflow::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a100, h100, v100"), std::string::npos) << e.what();
  }
}

TEST(PublishedCalibration, EachSaysWhatItIsInItsFirstLine) {
  for (const PublishedCalibration& p : published_calibrations()) {
    EXPECT_TRUE(p.yaml.starts_with("# Published calibration: ")) << p.name;
    EXPECT_FALSE(p.description().empty()) << p.name;
    EXPECT_EQ(p.description().find('\n'), std::string_view::npos) << p.name;
  }
}
