// Token sources: llm.c's token files (the layout, the dataloader's positions and wrap, the
// refusals) and the synthetic Markov stream (determinism, a doubly stochastic chain, and an
// entropy rate that a long sample's empirical conditional entropy confirms).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <thread>

#include "exec/token_data.hpp"
#include "model/error.hpp"
#include "tests/scratch.hpp"

using namespace hetflow;
using exec::Batch;
using exec::MarkovStream;
using exec::TokenFile;

namespace {

std::vector<int> iota_tokens(int n) {
  std::vector<int> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), 0);
  return t;
}

std::string le32s(std::initializer_list<std::int32_t> values) {
  std::string s;
  for (const std::int32_t v : values) {
    for (int i = 0; i < 4; ++i) s += static_cast<char>(static_cast<std::uint32_t>(v) >> (8 * i));
  }
  return s;
}

// An llm.c header with these first ints (the rest zero), then `tokens` as uint16.
std::string file_bytes(std::initializer_list<std::int32_t> header, const std::vector<int>& tokens) {
  std::string s = le32s(header);
  s.resize(1024, '\0');
  for (const int t : tokens) {
    s += static_cast<char>(t & 0xff);
    s += static_cast<char>(t >> 8 & 0xff);
  }
  return s;
}

InputError refusal(const std::string& path, int vocab = 50257) {
  try {
    TokenFile f(path, vocab);
  } catch (const InputError& e) {
    return e;
  }
  ADD_FAILURE() << path << " was read";
  return InputError("", 0, "", "");
}

void expect_refused(const std::string& bytes, const std::string& field, const std::string& words,
                    int vocab = 50257) {
  const std::string path = test_support::write_file("refused.bin", bytes);
  const InputError e = refusal(path, vocab);
  EXPECT_EQ(e.file(), path);
  EXPECT_EQ(e.field(), field) << e.what();
  EXPECT_NE(e.message().find(words), std::string::npos) << e.what();
  // The same refusal from the bytes in memory.
  try {
    exec::parse_token_file(bytes, "memory.bin", vocab);
    ADD_FAILURE() << "parsed";
  } catch (const InputError& m) {
    EXPECT_EQ(m.field(), e.field());
    EXPECT_EQ(m.message(), e.message());
  }
}

// llm.c's dataloader (train_gpt2.c, before shards): byte positions in the file, a reset to
// the first token whenever the next read would pass the end.
std::vector<long long> llmc_positions(long long n, int B, int T, int steps) {
  const long long header = 256 * 4, file_size = header + 2 * n;
  long long current = header;
  std::vector<long long> positions;
  for (int s = 0; s < steps; ++s) {
    if (current + (static_cast<long long>(B) * T + 1) * 2 > file_size) current = header;
    positions.push_back((current - header) / 2);
    current += static_cast<long long>(B) * T * 2;
  }
  return positions;
}

}  // namespace

// ---- llm.c token files ---------------------------------------------------------------------

TEST(TokenDataTest, WritesLlmCsLayoutAndReadsItBack) {
  const std::vector<int> tokens{0, 1, 50256, 65535, 258, 7};
  const std::string path = (test_support::scratch_dir() / "tokens.bin").string();
  exec::write_token_file(path, tokens);
  const std::string bytes = test_support::slurp(path);
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  EXPECT_EQ(bytes.substr(0, 12), le32s({20240520, 1, 6}));
  EXPECT_EQ(bytes.substr(12, 1012), std::string(1012, '\0'));
  EXPECT_EQ(bytes.substr(1024 + 6, 2), std::string("\xff\xff"));  // little-endian 65535
  EXPECT_EQ(bytes.substr(1024 + 8, 2), std::string("\x02\x01"));  // 258
  EXPECT_EQ(bytes, exec::encode_token_file(tokens));

  const TokenFile f(path, 65536);
  EXPECT_EQ(f.format(), exec::TokenFormat::gpt2);
  const std::vector<std::uint32_t> read = f.tokens();
  EXPECT_EQ(std::vector<int>(read.begin(), read.end()), tokens);
  EXPECT_EQ(exec::parse_token_file(bytes, "memory", 65536), f.tokens());
  EXPECT_NE(f.describe().find("6 tokens"), std::string::npos) << f.describe();
}

// llm.c's LLaMA 3 files (dev/data/data_common.py's "llama-3": magic 20240801, version 7,
// uint32 tokens) carry vocabularies past 65,536: Llama 3's 128,256, Qwen's 151,936.
TEST(TokenDataTest, WritesAndReadsLlmCsLlama3LayoutWithTokensPast65535) {
  const std::vector<int> tokens{0, 65535, 65536, 128255, 151935, 7, 300000};
  const std::string path = (test_support::scratch_dir() / "tokens_llama3.bin").string();
  exec::write_token_file(path, tokens, exec::TokenFormat::llama3);
  const std::string bytes = test_support::slurp(path);
  ASSERT_EQ(bytes.size(), 1024u + 4 * tokens.size());
  EXPECT_EQ(bytes.substr(0, 12), le32s({20240801, 7, 7}));
  EXPECT_EQ(bytes.substr(1024 + 8, 4), std::string("\x00\x00\x01\x00", 4));  // little-endian 65536
  const TokenFile f(path, 300001);
  EXPECT_EQ(f.format(), exec::TokenFormat::llama3);
  const std::vector<std::uint32_t> read = f.tokens();
  EXPECT_EQ(std::vector<int>(read.begin(), read.end()), tokens);
  const Batch b = f.batch(0, 2, 3);
  EXPECT_EQ(b.inputs, (std::vector<int>{0, 65535, 65536, 128255, 151935, 7}));
  EXPECT_EQ(b.targets, (std::vector<int>{65535, 65536, 128255, 151935, 7, 300000}));
  EXPECT_NE(f.describe().find("7 uint32 tokens"), std::string::npos) << f.describe();
  // The same refusals as a GPT-2 file's, sized at 4 bytes a token.
  expect_refused(bytes, "tokens[6]", "token 300000 at position 6 is not below the vocabulary size 151936", 151936);
  expect_refused(le32s({20240801, 7, 2}) + std::string(1012, '\0') + std::string(6, '\0'), "header.tokens",
                 "says 2 tokens, but 6 bytes follow it (4 per token)");
  expect_refused(file_bytes({20240801, 1, 0}, {}), "header.version", "magic 20240801 comes with version 7");
  expect_refused(file_bytes({20240520, 7, 0}, {}), "header.version", "magic 20240520 comes with version 1");
}

TEST(TokenDataTest, PositionsFollowLlmCsDataloaderWrapIncluded) {
  struct Case {
    long long n;
    int B, T;
  };
  for (const Case c : {Case{9, 2, 4}, Case{10, 2, 4}, Case{16, 2, 4}, Case{17, 2, 4}, Case{18, 2, 4},
                       Case{1000, 4, 64}, Case{1025, 4, 64}, Case{999, 3, 7}, Case{22, 1, 1}}) {
    const TokenFile f(std::vector<std::uint16_t>(static_cast<size_t>(c.n), 1), 2, "positions");
    const std::vector<long long> expected = llmc_positions(c.n, c.B, c.T, 60);
    for (int step = 0; step < 60; ++step) {
      ASSERT_EQ(f.position(step, c.B, c.T), expected[static_cast<size_t>(step)])
          << "n " << c.n << " B " << c.B << " T " << c.T << " step " << step;
    }
  }
  // The wrap spelled out: 10 tokens, B*T = 4: reads at 0 and 4, then 8 + 5 > 10 wraps.
  const TokenFile f(std::vector<std::uint16_t>(10, 0), 1, "wrap");
  EXPECT_EQ(f.position(0, 1, 4), 0);
  EXPECT_EQ(f.position(1, 1, 4), 4);
  EXPECT_EQ(f.position(2, 1, 4), 0);
  EXPECT_EQ(f.position(1'000'000'000'001LL, 1, 4), 4);  // any step, in constant time
}

TEST(TokenDataTest, BatchesAreSamplesOfTConsecutiveTokensAndTargetsAreShifted) {
  const std::string path = (test_support::scratch_dir() / "iota.bin").string();
  exec::write_token_file(path, iota_tokens(1000));
  const auto source = exec::open_token_file(path, 1000);
  const int B = 3, T = 16;
  for (long long step : {0LL, 1LL, 5LL, 20LL, 21LL}) {
    const Batch b = source->batch(step, B, T);
    const long long p = dynamic_cast<const TokenFile&>(*source).position(step, B, T);
    ASSERT_EQ(b.inputs.size(), static_cast<size_t>(B * T));
    ASSERT_EQ(b.targets.size(), static_cast<size_t>(B * T));
    for (int i = 0; i < B; ++i) {
      for (int t = 0; t < T; ++t) {
        const size_t k = static_cast<size_t>(i * T + t);
        EXPECT_EQ(b.inputs[k], p + i * T + t);
        EXPECT_EQ(b.targets[k], p + i * T + t + 1);
      }
    }
  }
  // 999 / 48 = 20 positions: the last starts at 912 (912 + 49 <= 1000 < 960 + 49).
  EXPECT_EQ(source->batch(19, B, T).inputs.front(), 912);
  EXPECT_EQ(source->batch(20, B, T).inputs.front(), 0);
}

TEST(TokenDataTest, RefusesAShortHeader) {
  expect_refused(le32s({20240520, 1, 0}), "header", "the file has 12 bytes");
}

TEST(TokenDataTest, RefusesAWrongMagic) {
  expect_refused(file_bytes({12345, 1, 0}, {}), "header.magic",
                 "not an llm.c token file: magic 12345, expected 20240520 (GPT-2's, uint16 tokens) or 20240801 (LLaMA 3's");
}

TEST(TokenDataTest, RefusesAnUnknownVersion) {
  expect_refused(file_bytes({20240520, 2, 0}, {}), "header.version", "version 2 is not read");
  expect_refused(file_bytes({20240801, 2, 0}, {}), "header.version", "version 2 is not read");
}

TEST(TokenDataTest, RefusesACountThatDoesNotMatchTheFile) {
  expect_refused(file_bytes({20240520, 1, 5}, {1, 2, 3}), "header.tokens", "says 5 tokens, but 6 bytes follow");
  expect_refused(file_bytes({20240520, 1, 2}, {1, 2, 3}), "header.tokens", "says 2 tokens");
  expect_refused(file_bytes({20240520, 1, -1}, {}), "header.tokens", "says -1 tokens");
  expect_refused(file_bytes({20240520, 1, 2147483647}, {1}), "header.tokens", "2147483647");
  expect_refused(file_bytes({20240520, 1, 1}, {1}) + "x", "header.tokens", "3 bytes follow");
}

TEST(TokenDataTest, RefusesATokenOutsideTheVocabularyNamingItsPosition) {
  expect_refused(file_bytes({20240520, 1, 4}, {0, 49, 50, 3}), "tokens[2]",
                 "token 50 at position 2 is not below the vocabulary size 50", 50);
  expect_refused(file_bytes({20240520, 1, 1}, {65535}), "tokens[0]", "token 65535", 50257);
}

TEST(TokenDataTest, RefusesAFileTooShortForOneStepGivingBothNumbers) {
  const TokenFile f(std::vector<std::uint16_t>(64, 0), 1, "short.bin");
  EXPECT_NO_THROW(f.batch(0, 3, 21));  // 63 + 1 = 64 tokens: exactly enough
  try {
    f.batch(0, 4, 16);
    FAIL() << "read";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "short.bin");
    EXPECT_EQ(e.field(), "tokens");
    EXPECT_NE(e.message().find("holds 64 tokens"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("B*T + 1 = 65"), std::string::npos) << e.what();
  }
}

TEST(TokenDataTest, RefusesNonPositiveShapesAndNegativeSteps) {
  const TokenFile f(std::vector<std::uint16_t>(64, 0), 1, "f");
  EXPECT_THROW(f.batch(0, 0, 4), InputError);
  EXPECT_THROW(f.batch(0, 4, 0), InputError);
  EXPECT_THROW(f.batch(-1, 1, 4), InputError);
  EXPECT_THROW(f.batch(0, 1 << 30, 1 << 30), InputError);  // B*T overflows no int
  EXPECT_THROW(TokenFile(std::vector<std::uint16_t>(4, 0), 0, "f"), InputError);
}

TEST(TokenDataTest, RefusesAMissingFile) {
  const InputError e = refusal((test_support::scratch_dir() / "absent.bin").string());
  EXPECT_EQ(e.field(), "file");
}

TEST(TokenDataTest, WriterRefusesTokensThatDoNotFitAndLeavesNoFile) {
  const std::string path = (test_support::scratch_dir() / "unwritten.bin").string();
  try {
    exec::write_token_file(path, std::vector<int>{1, 2, 65536});
    FAIL() << "written";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(e.field(), "tokens[2]");
  }
  EXPECT_THROW(exec::write_token_file(path, std::vector<int>{-1}), InputError);
  EXPECT_THROW(exec::write_token_file(path, std::vector<int>{-1}, exec::TokenFormat::llama3), InputError);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TokenDataTest, BatchesFromManyThreadsEqualBatchesFromOne) {
  std::vector<int> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(i * 7919 % 50257);
  const std::string path = (test_support::scratch_dir() / "threads.bin").string();
  exec::write_token_file(path, tokens);
  const auto source = exec::open_token_file(path, 50257);
  std::vector<Batch> expected;
  for (int step = 0; step < 64; ++step) expected.push_back(source->batch(step, 4, 32));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int step = 63 - t; step >= 0; --step) {
        const Batch b = source->batch(step, 4, 32);
        mismatches[static_cast<size_t>(t)] += b.inputs != expected[static_cast<size_t>(step)].inputs ||
                                              b.targets != expected[static_cast<size_t>(step)].targets;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// ---- the Markov stream ---------------------------------------------------------------------

TEST(MarkovTest, TheStreamIsADeterministicFunctionOfTheSeed) {
  const MarkovStream a(50257, 7), b(50257, 7), c(50257, 8);
  EXPECT_EQ(a.tokens(0, 10'000), b.tokens(0, 10'000));
  EXPECT_NE(a.tokens(0, 10'000), c.tokens(0, 10'000));
  EXPECT_EQ(a.entropy_nats(), b.entropy_nats());
  EXPECT_EQ(a.describe(), b.describe());
  // Pinned, so that a change of the stream (which would move every loss curve) is seen.
  // The stream is integer arithmetic only: the same on every platform.
  const MarkovStream pinned(1000, 1);
  EXPECT_EQ(pinned.tokens(0, 8), (std::vector<int>{952, 399, 268, 672, 810, 476, 890, 216}));
  EXPECT_NEAR(pinned.entropy_nats(), 1.280014527036478, 1e-12);
}

TEST(MarkovTest, BatchesReadOneSequenceAtLlmCsPositionsWithoutWrapping) {
  const MarkovStream s(5000, 3);
  const int B = 4, T = 33;
  const std::vector<int> all = s.tokens(0, 40 * B * T + 1);
  for (long long step = 0; step < 40; ++step) {
    const Batch b = s.batch(step, B, T);
    const auto p = static_cast<size_t>(step * B * T);
    EXPECT_EQ(b.inputs, std::vector<int>(all.begin() + p, all.begin() + p + B * T)) << step;
    EXPECT_EQ(b.targets, std::vector<int>(all.begin() + p + 1, all.begin() + p + B * T + 1)) << step;
  }
  EXPECT_EQ(s.batch(1, B, T).inputs.front(), s.batch(0, B, T).targets.back());
}

TEST(MarkovTest, CheckpointsDoNotChangeTheStream) {
  const MarkovStream s(97, 11);
  const long long c = MarkovStream::kCheckpointTokens;
  const std::vector<int> all = s.tokens(0, 5 * c + 10);
  // Stretches across checkpoint boundaries, asked out of order, from a fresh stream too.
  const MarkovStream fresh(97, 11);
  for (const long long begin : {4 * c - 3, c, 0LL, 3 * c + 1, 2 * c - 1}) {
    const std::vector<int> part = fresh.tokens(begin, 9);
    EXPECT_EQ(part, std::vector<int>(all.begin() + begin, all.begin() + begin + 9)) << begin;
  }
}

TEST(MarkovTest, EachTokenHasDistinctSuccessorsAndTheMatrixIsDoublyStochastic) {
  for (const int vocab : {1, 2, 3, 5, 64, 1000}) {
    const MarkovStream s(vocab, 42);
    const std::vector<double>& p = s.probabilities();
    ASSERT_EQ(p.size(), static_cast<size_t>(std::min(vocab, 4)));
    EXPECT_EQ(std::accumulate(p.begin(), p.end(), 0.0), 1.0);  // multiples of 2^-32 summing to 1 exactly
    std::vector<double> column(static_cast<size_t>(vocab), 0.0);
    for (int x = 0; x < vocab; ++x) {
      const std::vector<int> next = s.successors(x);
      EXPECT_EQ(std::set<int>(next.begin(), next.end()).size(), next.size()) << "vocab " << vocab << " token " << x;
      for (size_t j = 0; j < next.size(); ++j) column[static_cast<size_t>(next[j])] += p[j];
    }
    for (int y = 0; y < vocab; ++y) EXPECT_NEAR(column[static_cast<size_t>(y)], 1.0, 1e-12) << vocab << " " << y;
    double h = 0;
    for (const double q : p) h -= q * std::log(q);
    EXPECT_DOUBLE_EQ(s.entropy_nats(), h);
    EXPECT_LE(s.entropy_nats(), std::log(static_cast<double>(p.size())) + 1e-12);
  }
  EXPECT_EQ(MarkovStream(1, 5).entropy_nats(), 0.0);
  EXPECT_EQ(MarkovStream(1, 5).tokens(0, 5), std::vector<int>(5, 0));
}

TEST(MarkovTest, TokensAreUniformInALongSample) {
  const int vocab = 64;
  const long long n = 4'000'000;
  const MarkovStream s(vocab, 2024);
  std::vector<long long> count(vocab, 0);
  for (const int t : s.tokens(0, n)) ++count[static_cast<size_t>(t)];
  const double expected = static_cast<double>(n) / vocab;
  for (int t = 0; t < vocab; ++t) {
    EXPECT_NEAR(count[static_cast<size_t>(t)] / expected, 1.0, 0.03) << "token " << t;
  }
  // Every position's token is uniform, the first included: over many seeds.
  std::vector<int> first(8, 0);
  for (std::uint64_t seed = 0; seed < 8000; ++seed) ++first[static_cast<size_t>(MarkovStream(8, seed).tokens(0, 1)[0])];
  for (const int f : first) EXPECT_NEAR(f, 1000, 150);
}

TEST(MarkovTest, EmpiricalConditionalEntropyMatchesTheEntropyRate) {
  for (const std::uint64_t seed : {1ULL, 99ULL}) {
    const int vocab = 1000;
    const long long n = 4'000'000;
    const MarkovStream s(vocab, seed);
    const std::vector<int> sample = s.tokens(0, n);
    std::map<std::pair<int, int>, long long> pairs;
    std::vector<long long> from(vocab, 0);
    for (size_t i = 0; i + 1 < sample.size(); ++i) {
      ++pairs[{sample[i], sample[i + 1]}];
      ++from[static_cast<size_t>(sample[i])];
    }
    double h = 0;
    const double total = static_cast<double>(n - 1);
    for (const auto& [pair, c] : pairs) {
      h -= static_cast<double>(c) / total *
           std::log(static_cast<double>(c) / static_cast<double>(from[static_cast<size_t>(pair.first)]));
    }
    EXPECT_NEAR(h / s.entropy_nats(), 1.0, 0.02) << "seed " << seed << ": estimated " << h << ", exact "
                                                 << s.entropy_nats();
    EXPECT_GT(s.entropy_nats(), 0.5);  // far from a trivial chain
  }
}

TEST(MarkovTest, RefusesBadArguments) {
  EXPECT_THROW(MarkovStream(0, 1), InputError);
  EXPECT_THROW(MarkovStream(1 << 29, 1), InputError);
  EXPECT_THROW(MarkovStream(10, 1, 0), InputError);
  const MarkovStream s(10, 1);
  EXPECT_THROW(s.batch(-1, 1, 1), InputError);
  EXPECT_THROW(s.batch(0, 0, 1), InputError);
  EXPECT_THROW(s.batch(0, 1 << 16, 1 << 15), InputError);  // 2^31 tokens a step
  EXPECT_THROW(s.batch(1LL << 62, 4, 4), InputError);      // positions past 2^63
  EXPECT_THROW(s.successors(10), InputError);
}

TEST(MarkovTest, BatchesFromManyThreadsEqualBatchesFromOne) {
  const MarkovStream reference(50257, 5);
  std::vector<Batch> expected;
  for (int step = 0; step < 48; ++step) expected.push_back(reference.batch(step, 2, 1024));
  const auto stream = exec::markov_stream(50257, 5);  // fresh: the threads grow its checkpoints
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 48; ++k) {
        const int step = t % 2 == 0 ? k : 47 - k;
        const Batch b = stream->batch(step, 2, 1024);
        mismatches[static_cast<size_t>(t)] += b.inputs != expected[static_cast<size_t>(step)].inputs ||
                                              b.targets != expected[static_cast<size_t>(step)].targets;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// A micro-batch's loader reads its samples alone: rows [first, first + count) of the step's
// batch, the same tokens and targets, for a file (its wrap included), a wide file, the
// Markov stream and a source that only has batch(); a range outside the batch is refused.
TEST(TokenDataTest, SamplesAreTheBatchsRows) {
  struct OnlyBatches final : exec::TokenSource {
    Batch batch(long long step, int B, int T) const override { return MarkovStream(101, 3).batch(step, B, T); }
    std::string describe() const override { return "only batches"; }
  };
  const TokenFile narrow(std::vector<std::uint16_t>{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8},
                         10, "narrow");
  std::vector<std::uint32_t> wide_tokens(200);
  for (size_t i = 0; i < wide_tokens.size(); ++i) wide_tokens[i] = static_cast<std::uint32_t>(70000 + i * 7 % 97);
  const TokenFile wide(wide_tokens, 80000, "wide");
  const MarkovStream stream(97, 11);
  const OnlyBatches only;
  const int B = 4, T = 3;
  for (const exec::TokenSource* source : std::initializer_list<const exec::TokenSource*>{&narrow, &wide, &stream, &only}) {
    for (long long step : {0LL, 1LL, 2LL, 3LL, 17LL}) {  // the narrow file (27 tokens, 12 a step) wraps at step 2
      const Batch whole = source->batch(step, B, T);
      for (int first = 0; first < B; ++first) {
        for (int count = 1; first + count <= B; ++count) {
          const Batch part = source->samples(step, B, T, first, count);
          const auto from = whole.inputs.begin() + first * T;
          EXPECT_EQ(part.inputs, std::vector<int>(from, from + count * T)) << source->describe() << " step " << step;
          const auto targets = whole.targets.begin() + first * T;
          EXPECT_EQ(part.targets, std::vector<int>(targets, targets + count * T)) << source->describe() << " step " << step;
        }
      }
    }
    for (const auto& [first, count] : {std::pair{-1, 1}, {0, 0}, {3, 2}, {4, 1}}) {
      try {
        (void)source->samples(0, B, T, first, count);
        ADD_FAILURE() << source->describe() << ": samples " << first << " + " << count << " accepted";
      } catch (const InputError& e) {
        EXPECT_EQ(e.field(), "samples") << e.what();
        EXPECT_NE(std::string(e.what()).find("expected a range within the batch's 4 samples, found " + std::to_string(count) +
                                             " from " + std::to_string(first)),
                  std::string::npos)
            << e.what();
      }
    }
  }
}
