#pragma once
// The tokens the executor's training reads: llm.c's token files, and a synthetic Markov
// stream whose entropy rate is known exactly (a floor for the training loss) for when no
// file is given. Both are TokenSources read in batches exactly as llm.c's dataloader reads a
// file.
//
// Batches: step k of a run with B samples of T tokens reads B*T + 1 consecutive tokens from
// position p_k; sample i's inputs are tokens [p_k + i*T, p_k + i*T + T) and its targets the
// same positions plus one. p_0 = 0 and p_{k+1} = p_k + B*T, except that a file wraps to 0
// whenever p + B*T + 1 would pass its end (llm.c's dataloader_next_batch); a stream never
// ends. So a file's steps cycle through floor((n - 1) / (B*T)) positions.
//
// batch() is const and safe to call from several threads at once, for any steps in any
// order.
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hetflow::exec {

struct Batch {
  std::vector<int> inputs, targets;  // B*T each, sample-major: sample i's tokens at [i*T, i*T + T)
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Step `step` (from 0) of a run with B samples of T tokens each. Throws InputError when
  // B or T is not positive or the source cannot give B*T + 1 tokens.
  virtual Batch batch(long long step, int B, int T) const = 0;
  // Samples [first, first + count) of that step's batch, read alone (what one micro-batch's
  // loader reads): the same tokens as the batch's rows. Throws InputError as batch() does,
  // and for a range outside [0, B). The default slices batch(); both sources read only the
  // range.
  virtual Batch samples(long long step, int B, int T, int first, int count) const;
  // One line for logs: what the tokens are.
  virtual std::string describe() const = 0;
};

// ---- llm.c token files --------------------------------------------------------------------
// A header of 256 little-endian int32: [0] the magic, [1] the version, [2] the token count n;
// then n little-endian tokens. llm.c writes two kinds (dev/data/data_common.py): GPT-2's,
// magic 20240520 and version 1, uint16 tokens; and LLaMA 3's, magic 20240801 and version 7,
// uint32 tokens, for vocabularies past 65,536 (Llama 3's 128,256, Qwen's 151,936). Reading
// refuses, with an InputError naming the file and the field: a file shorter than the header
// ("header"), another magic ("header.magic"), a version other than its magic's
// ("header.version"), a count that is negative or does not match the file's size
// ("header.tokens"), and a token >= the model's vocabulary ("tokens[i]", i its position).

enum class TokenFormat { gpt2, llama3 };  // llm.c's "gpt-2" (uint16) and "llama-3" (uint32)
inline constexpr std::int32_t kTokenFileMagic = 20240520, kTokenFileVersion = 1;
inline constexpr std::int32_t kLlama3TokenFileMagic = 20240801, kLlama3TokenFileVersion = 7;
inline constexpr int kTokenFileHeaderInts = 256;

class TokenFile : public TokenSource {
 public:
  // Reads and checks the file against a vocabulary of `vocab` tokens (vocab >= 1).
  TokenFile(const std::string& path, int vocab);
  // Tokens already in memory (checked against `vocab` as a file's are); `name` names them.
  TokenFile(std::vector<std::uint16_t> tokens, int vocab, std::string name);
  TokenFile(std::vector<std::uint32_t> tokens, int vocab, std::string name);

  Batch batch(long long step, int B, int T) const override;
  Batch samples(long long step, int B, int T, int first, int count) const override;
  std::string describe() const override;

  // Where step `step` starts reading: llm.c's position arithmetic, the wrap included.
  long long position(long long step, int B, int T) const;
  size_t size() const { return wide_ ? tokens32_.size() : tokens16_.size(); }
  std::vector<std::uint32_t> tokens() const;  // a copy, widened
  TokenFormat format() const { return wide_ ? TokenFormat::llama3 : TokenFormat::gpt2; }
  int vocab() const { return vocab_; }

 private:
  long long checked_step_tokens(long long step, int B, int T) const;  // B*T, or throws

  // One of the two holds the tokens, as the file stored them (a GPT-2 file stays 2 bytes a
  // token in memory).
  bool wide_ = false;
  std::vector<std::uint16_t> tokens16_;
  std::vector<std::uint32_t> tokens32_;
  int vocab_;
  std::string name_;
};

std::unique_ptr<TokenSource> open_token_file(const std::string& path, int vocab);
// The tokens of a whole file held in memory, checked as TokenFile checks a file; `file`
// names it in errors. `format`, when given, receives the file's.
std::vector<std::uint32_t> parse_token_file(std::string_view bytes, const std::string& file, int vocab,
                                            TokenFormat* format = nullptr);
// Writes an llm.c token file of `format`, whole or not at all. Throws InputError naming the
// path for a token outside [0, 65535] (gpt2) or [0, 2^31) (llama3) ("tokens[i]"), or more
// than 2^31 - 1 tokens.
void write_token_file(const std::string& path, std::span<const int> tokens, TokenFormat format = TokenFormat::gpt2);
// The bytes write_token_file writes.
std::string encode_token_file(std::span<const int> tokens, const std::string& file = "<tokens>",
                              TokenFormat format = TokenFormat::gpt2);

// ---- the synthetic Markov stream -----------------------------------------------------------
// Tokens 0..V-1. A seeded permutation `perm` of [0, V), K = min(successors, V) distinct
// seeded offsets o_j in [0, V) and seeded probabilities p_j (each a multiple of 2^-32, drawn
// exactly so): after token x comes perm[(x + o_j) mod V] with probability p_j. A state's K
// successors are distinct and every token is the successor of exactly K states with the
// probabilities p_1..p_K, so the transition matrix is doubly stochastic: the uniform
// distribution is stationary, and since the first token is drawn uniformly every position's
// token is uniform. Every row has the same entropy, so the entropy rate is exactly
// H(p) = -sum_j p_j ln p_j nats per token (entropy_nats()): the loss a perfect model
// converges to. The offsets are redrawn until the chain is irreducible, so one long sample's
// frequencies approach the uniform distribution too.
//
// The stream is one infinite token sequence, a deterministic function of (vocab, seed,
// successors) on every platform; step k reads from position k*B*T. Each choice comes from a
// hash of the seed and the position, so a token depends only on the token before it and its
// position: the stream keeps the token at every kCheckpointTokens-th position it has
// reached (one int each, under a mutex), and a batch is generated from the checkpoint before
// it. A batch costs O(B*T + kCheckpointTokens) once the steps before it have been read;
// jumping ahead to step k the first time costs generating k*B*T tokens.

class MarkovStream : public TokenSource {
 public:
  static constexpr int kDefaultSuccessors = 4;
  static constexpr long long kCheckpointTokens = 4096;
  static constexpr long long kMaxStepTokens = 1LL << 30;  // B*T at most

  // Throws InputError (file "markov stream") for vocab outside [1, model::limits::kMaxVocab]
  // or successors < 1.
  MarkovStream(int vocab, std::uint64_t seed, int successors = kDefaultSuccessors);

  Batch batch(long long step, int B, int T) const override;
  Batch samples(long long step, int B, int T, int first, int count) const override;
  std::string describe() const override;

  double entropy_nats() const { return entropy_nats_; }
  int vocab() const { return vocab_; }
  // Token `token`'s successors and their probabilities (K of each; the successors distinct).
  std::vector<int> successors(int token) const;
  const std::vector<double>& probabilities() const { return probabilities_; }
  // Tokens [begin, begin + count) of the stream.
  std::vector<int> tokens(long long begin, long long count) const;

 private:
  int next(int token, long long position) const;  // the token at position + 1
  int token_at_checkpoint(long long checkpoint) const;

  int vocab_;
  std::uint64_t seed_;
  std::vector<int> perm_;
  std::vector<int> offsets_;
  std::vector<std::uint64_t> thresholds_;  // cumulative weights (of 2^32) of the offsets
  std::vector<double> probabilities_;
  double entropy_nats_ = 0;
  mutable std::mutex mutex_;
  mutable std::vector<int> checkpoints_;  // the token at position c * kCheckpointTokens
};

std::unique_ptr<MarkovStream> markov_stream(int vocab, std::uint64_t seed);

}  // namespace hetflow::exec
