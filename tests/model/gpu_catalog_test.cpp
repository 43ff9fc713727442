// Sanity checks on the built-in GPU catalog (model/gpu_catalog.cpp): every entry is
// complete and self-consistent, and a few values match the vendor data sheets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "model/gpu.hpp"

namespace hetflow::model {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Local lookup so these tests do not depend on find_builtin_gpu.
const GpuSpec* lookup(const std::string& name) {
  for (const GpuSpec& g : builtin_gpus()) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Parts without tensor cores (their FP16 is CUDA-core arithmetic).
const std::set<std::string> kNoTensorCores = {"P100", "P100-PCIE", "Quadro-P4000"};
// Parts without BF16 arithmetic (Pascal, Volta, Turing).
const std::set<std::string> kNoBf16 = {"P100",    "P100-PCIE", "Quadro-P4000",
                                       "V100-16", "V100-32",   "TITAN-V",
                                       "T4",      "TITAN-RTX", "RTX-2060"};

TEST(GpuCatalog, HasEveryExpectedEntry) {
  const std::vector<std::string> expected = {
      "P100",     "P100-PCIE", "V100-16",  "V100-32",  "A100-40",   "A100-80",
      "H100-SXM", "H200",      "T4",       "L4",       "A10",       "RTX-2060",
      "RTX-3090", "RTX-4090",  "TITAN-V",  "TITAN-RTX", "Quadro-P4000"};
  for (const std::string& name : expected) {
    EXPECT_NE(lookup(name), nullptr) << "missing catalog entry " << name;
  }
  EXPECT_EQ(builtin_gpus().size(), expected.size());
}

TEST(GpuCatalog, SameObjectOnEveryCall) {
  const auto& a = builtin_gpus();
  const auto& b = builtin_gpus();
  EXPECT_EQ(&a, &b);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a.front().name, "P100");  // stable order, oldest first
}

TEST(GpuCatalog, NamesAreUniqueIgnoringCase) {
  std::set<std::string> seen;
  for (const GpuSpec& g : builtin_gpus()) {
    EXPECT_TRUE(seen.insert(lower(g.name)).second) << "duplicate name " << g.name;
  }
}

TEST(GpuCatalog, NamesAreSimpleKeys) {
  for (const GpuSpec& g : builtin_gpus()) {
    ASSERT_FALSE(g.name.empty());
    for (char c : g.name) {
      EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '-')
          << "odd character in name '" << g.name << "'";
    }
  }
}

TEST(GpuCatalog, EveryEntryIsComplete) {
  for (const GpuSpec& g : builtin_gpus()) {
    SCOPED_TRACE(g.name);
    EXPECT_FALSE(g.description.empty());
    EXPECT_EQ(g.description.find('\n'), std::string::npos);
    EXPECT_GT(g.fp16_flops_per_s, 0);
    EXPECT_GE(g.bf16_flops_per_s, 0);
    EXPECT_GT(g.fp32_flops_per_s, 0);
    EXPECT_GT(g.memory_bytes, 0);
    EXPECT_GT(g.memory_bandwidth_bytes_per_s, 0);
    EXPECT_GT(g.usual_link_bandwidth_bytes_per_s, 0);
    EXPECT_TRUE(std::isfinite(g.fp16_flops_per_s));
    EXPECT_TRUE(std::isfinite(g.fp32_flops_per_s));
  }
}

TEST(GpuCatalog, RatesAreInPlausibleUnits) {
  // Catches a TFLOPS or GB/s figure entered without its exponent, or one entered twice.
  for (const GpuSpec& g : builtin_gpus()) {
    SCOPED_TRACE(g.name);
    EXPECT_GT(g.fp32_flops_per_s, 1e12);
    EXPECT_LT(g.fp32_flops_per_s, 1e15);
    EXPECT_LT(g.fp16_flops_per_s, 1e16);
    EXPECT_GT(g.memory_bytes, 1 * kGiB);
    EXPECT_LT(g.memory_bytes, 1024 * kGiB);
    EXPECT_GT(g.memory_bandwidth_bytes_per_s, 100e9);
    EXPECT_LT(g.memory_bandwidth_bytes_per_s, 100e12);
    EXPECT_GE(g.usual_link_bandwidth_bytes_per_s, 10e9);
    EXPECT_LT(g.usual_link_bandwidth_bytes_per_s, 10e12);
  }
}

TEST(GpuCatalog, MemoryIsWholeGiB) {
  for (const GpuSpec& g : builtin_gpus()) {
    const double gib = g.memory_bytes / kGiB;
    EXPECT_EQ(gib, std::round(gib)) << g.name;
  }
}

TEST(GpuCatalog, Fp16NeverSlowerThanFp32) {
  for (const GpuSpec& g : builtin_gpus()) {
    EXPECT_GE(g.fp16_flops_per_s, g.fp32_flops_per_s) << g.name;
  }
}

TEST(GpuCatalog, TensorCorePartsAreAtLeastTwiceFp32) {
  // Even GeForce parts at half-rate FP32 accumulate reach 2x their FP32 rate.
  for (const GpuSpec& g : builtin_gpus()) {
    if (kNoTensorCores.count(g.name) != 0) continue;
    EXPECT_GE(g.fp16_flops_per_s, 1.99 * g.fp32_flops_per_s) << g.name;
  }
}

TEST(GpuCatalog, Bf16OnlyWhereTheHardwareHasIt) {
  for (const GpuSpec& g : builtin_gpus()) {
    SCOPED_TRACE(g.name);
    if (kNoBf16.count(g.name) != 0) {
      EXPECT_EQ(g.bf16_flops_per_s, 0);
    } else {
      // Ampere and later: BF16 tensor rate equals the FP16 (FP32 accumulate) rate.
      EXPECT_GT(g.bf16_flops_per_s, g.fp32_flops_per_s);
      EXPECT_DOUBLE_EQ(g.bf16_flops_per_s, g.fp16_flops_per_s);
    }
  }
}

TEST(GpuCatalog, LinkKindMatchesBandwidth) {
  for (const GpuSpec& g : builtin_gpus()) {
    SCOPED_TRACE(g.name);
    if (g.usual_link == LinkKind::pcie) {
      EXPECT_LE(g.usual_link_bandwidth_bytes_per_s, 64e9);  // at most PCIe Gen5 x16
    } else {
      EXPECT_GE(g.usual_link_bandwidth_bytes_per_s, 80e9);  // at least NVLink 1.0 (P100)
    }
  }
}

TEST(GpuCatalog, V100_32MatchesDatasheet) {
  const GpuSpec* g = lookup("V100-32");
  ASSERT_NE(g, nullptr);
  EXPECT_DOUBLE_EQ(g->memory_bytes, 32 * kGiB);
  EXPECT_DOUBLE_EQ(g->memory_bandwidth_bytes_per_s, 900e9);
  EXPECT_DOUBLE_EQ(g->fp32_flops_per_s, 15.7e12);
  EXPECT_DOUBLE_EQ(g->fp16_flops_per_s, 125e12);
  EXPECT_EQ(g->bf16_flops_per_s, 0);
  EXPECT_EQ(g->usual_link, LinkKind::nvlink);
  EXPECT_DOUBLE_EQ(g->usual_link_bandwidth_bytes_per_s, 150e9);
}

TEST(GpuCatalog, A100_80MatchesDatasheet) {
  const GpuSpec* g = lookup("A100-80");
  ASSERT_NE(g, nullptr);
  EXPECT_DOUBLE_EQ(g->memory_bytes, 80 * kGiB);
  EXPECT_DOUBLE_EQ(g->memory_bandwidth_bytes_per_s, 2039e9);
  EXPECT_DOUBLE_EQ(g->fp16_flops_per_s, 312e12);
  EXPECT_DOUBLE_EQ(g->bf16_flops_per_s, 312e12);
  EXPECT_DOUBLE_EQ(g->fp32_flops_per_s, 19.5e12);
  EXPECT_EQ(g->usual_link, LinkKind::nvswitch);
  EXPECT_DOUBLE_EQ(g->usual_link_bandwidth_bytes_per_s, 300e9);
}

TEST(GpuCatalog, H100AndH200ShareComputeButNotMemory) {
  const GpuSpec* h100 = lookup("H100-SXM");
  const GpuSpec* h200 = lookup("H200");
  ASSERT_NE(h100, nullptr);
  ASSERT_NE(h200, nullptr);
  EXPECT_DOUBLE_EQ(h100->fp16_flops_per_s, 989.4e12);
  EXPECT_DOUBLE_EQ(h200->fp16_flops_per_s, h100->fp16_flops_per_s);
  EXPECT_DOUBLE_EQ(h200->fp32_flops_per_s, h100->fp32_flops_per_s);
  EXPECT_DOUBLE_EQ(h100->memory_bytes, 80 * kGiB);
  EXPECT_DOUBLE_EQ(h200->memory_bytes, 141 * kGiB);
  EXPECT_DOUBLE_EQ(h100->memory_bandwidth_bytes_per_s, 3.35e12);
  EXPECT_DOUBLE_EQ(h200->memory_bandwidth_bytes_per_s, 4.8e12);
  EXPECT_DOUBLE_EQ(h200->usual_link_bandwidth_bytes_per_s, 450e9);
}

TEST(GpuCatalog, GeForceUsesFp32AccumulateFigure) {
  // Half the FP16-accumulate tensor rate: 71 (not 142) and 165.2 (not 330.3) TFLOPS.
  const GpuSpec* rtx3090 = lookup("RTX-3090");
  const GpuSpec* rtx4090 = lookup("RTX-4090");
  ASSERT_NE(rtx3090, nullptr);
  ASSERT_NE(rtx4090, nullptr);
  EXPECT_DOUBLE_EQ(rtx3090->fp16_flops_per_s, 71e12);
  EXPECT_DOUBLE_EQ(rtx4090->fp16_flops_per_s, 165.2e12);
}

TEST(GpuCatalog, QuadroP4000Fp16RunsAtFp32Rate) {
  const GpuSpec* g = lookup("Quadro-P4000");
  ASSERT_NE(g, nullptr);
  EXPECT_DOUBLE_EQ(g->fp16_flops_per_s, g->fp32_flops_per_s);
  EXPECT_DOUBLE_EQ(g->memory_bytes, 8 * kGiB);
}

}  // namespace
}  // namespace hetflow::model
