#include "exec/token_data.hpp"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "exec/atomic_file.hpp"
#include "exec/binary_io.hpp"
#include "model/error.hpp"
#include "model/limits.hpp"

namespace hetflow::exec {

namespace {

constexpr size_t kHeaderBytes = kTokenFileHeaderInts * sizeof(std::int32_t);

struct Header {
  TokenFormat format;
  size_t count;
  size_t width() const { return format == TokenFormat::gpt2 ? 2 : 4; }  // bytes a token
};

// The format and token count the header promises, checked against the file's size.
Header check_header(const unsigned char* header, std::uint64_t file_bytes, const std::string& file) {
  const auto magic = static_cast<std::int32_t>(load_le32(header));
  const auto version = static_cast<std::int32_t>(load_le32(header + 4));
  const auto count = static_cast<std::int32_t>(load_le32(header + 8));
  if (magic != kTokenFileMagic && magic != kLlama3TokenFileMagic) {
    throw InputError(file, 0, "header.magic",
                     "not an llm.c token file: magic " + std::to_string(magic) + ", expected " +
                         std::to_string(kTokenFileMagic) + " (GPT-2's, uint16 tokens) or " +
                         std::to_string(kLlama3TokenFileMagic) + " (LLaMA 3's, uint32 tokens)");
  }
  const bool llama3 = magic == kLlama3TokenFileMagic;
  const std::int32_t expected = llama3 ? kLlama3TokenFileVersion : kTokenFileVersion;
  if (version != expected) {
    throw InputError(file, 0, "header.version",
                     "version " + std::to_string(version) + " is not read; magic " + std::to_string(magic) +
                         " comes with version " + std::to_string(expected) + (llama3 ? " (uint32 tokens)" : " (uint16 tokens)"));
  }
  const Header h{llama3 ? TokenFormat::llama3 : TokenFormat::gpt2, 0};
  const std::uint64_t token_bytes = file_bytes - kHeaderBytes;
  if (count < 0 || token_bytes != h.width() * static_cast<std::uint64_t>(count)) {
    throw InputError(file, 0, "header.tokens",
                     "the header says " + std::to_string(count) + " tokens, but " + std::to_string(token_bytes) +
                         " bytes follow it (" + std::to_string(h.width()) + " per token)");
  }
  return {h.format, static_cast<size_t>(count)};
}

void check_short_file(std::uint64_t file_bytes, const std::string& file) {
  if (file_bytes < kHeaderBytes) {
    throw InputError(file, 0, "header",
                     "the file has " + std::to_string(file_bytes) +
                         " bytes; an llm.c token file begins with a header of 256 int32 (1024 bytes)");
  }
}

void check_vocab(int vocab, const std::string& file) {
  if (vocab < 1) throw InputError(file, 0, "vocab", "the vocabulary size " + std::to_string(vocab) + " is below 1");
}

template <typename Token>
void check_tokens(std::span<const Token> tokens, int vocab, const std::string& file) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (static_cast<std::uint64_t>(tokens[i]) >= static_cast<std::uint64_t>(vocab)) {
      throw InputError(file, 0, "tokens[" + std::to_string(i) + "]",
                       "token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                           " is not below the vocabulary size " + std::to_string(vocab));
    }
  }
}

// B*T, for B and T positive and not so large that one step's vectors are absurd.
long long step_tokens(int B, int T, long long step, const std::string& file, long long max_tokens) {
  if (B < 1) throw InputError(file, 0, "batch", "B = " + std::to_string(B) + " samples: expected at least 1");
  if (T < 1) throw InputError(file, 0, "seq_len", "T = " + std::to_string(T) + " tokens: expected at least 1");
  if (step < 0) throw InputError(file, 0, "step", std::to_string(step) + " is negative");
  const long long bt = static_cast<long long>(B) * T;
  if (bt > max_tokens) {
    throw InputError(file, 0, "batch",
                     "B*T = " + std::to_string(bt) + " tokens a step: more than " + std::to_string(max_tokens));
  }
  return bt;
}

Batch batch_of(std::span<const int> tokens, long long bt) {
  Batch b;
  b.inputs.assign(tokens.begin(), tokens.begin() + bt);
  b.targets.assign(tokens.begin() + 1, tokens.begin() + bt + 1);
  return b;
}

// SplitMix64's finalizer: a bijection of 64-bit words that mixes every bit into every bit.
std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
constexpr std::uint64_t kGamma = 0x9e3779b97f4a7c15ULL;

// SplitMix64, for drawing the chain's parameters (the same numbers on every platform and
// standard library, which <random>'s distributions do not promise).
struct SplitMix {
  std::uint64_t state;
  std::uint64_t next() { return mix(state += kGamma); }
  // Uniform in [0, n), n >= 1, by rejection: exactly uniform, not nearly.
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t reject_under = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const std::uint64_t r = next();
      if (r >= reject_under) return r % n;
    }
  }
};

constexpr std::uint64_t kWeightTotal = std::uint64_t{1} << 32;
constexpr int kMaxSuccessors = 1 << 16;
const std::string kStreamName = "markov stream";

// Samples [first, first + count) of a batch of B: InputError naming `source` otherwise.
void check_samples(int B, int first, int count, const std::string& source) {
  if (first < 0 || count < 1 || first > B - count) {
    throw InputError(source, 0, "samples",
                     "expected a range within the batch's " + std::to_string(B) + " samples, found " + std::to_string(count) +
                         " from " + std::to_string(first));
  }
}

}  // namespace

// ---- llm.c token files --------------------------------------------------------------------

std::vector<std::uint32_t> parse_token_file(std::string_view bytes, const std::string& file, int vocab,
                                            TokenFormat* format) {
  check_vocab(vocab, file);
  check_short_file(bytes.size(), file);
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const Header h = check_header(data, bytes.size(), file);
  std::vector<std::uint32_t> tokens(h.count);
  for (size_t i = 0; i < h.count; ++i) {
    const unsigned char* at = data + kHeaderBytes + h.width() * i;
    tokens[i] = h.format == TokenFormat::gpt2 ? load_le16(at) : load_le32(at);
  }
  check_tokens(std::span<const std::uint32_t>(tokens), vocab, file);
  if (format != nullptr) *format = h.format;
  return tokens;
}

TokenFile::TokenFile(const std::string& path, int vocab) : vocab_(vocab), name_(path) {
  check_vocab(vocab, path);
  const ReadOnlyFile in(path);
  check_short_file(in.size_bytes(), path);
  unsigned char header[kHeaderBytes];
  in.read(0, kHeaderBytes, header);
  // Allocated only once the count matches the file's size: a hostile header cannot ask for
  // more memory than the file holds.
  const Header h = check_header(header, in.size_bytes(), path);
  wide_ = h.format == TokenFormat::llama3;
  if (wide_) {
    tokens32_.resize(h.count);
    in.read(kHeaderBytes, h.count * 4, tokens32_.data());
    if constexpr (std::endian::native == std::endian::big) {
      for (std::uint32_t& t : tokens32_) t = t >> 24 | (t >> 8 & 0xff00u) | (t << 8 & 0xff0000u) | t << 24;
    }
    check_tokens(std::span<const std::uint32_t>(tokens32_), vocab, path);
  } else {
    tokens16_.resize(h.count);
    in.read(kHeaderBytes, h.count * 2, tokens16_.data());
    if constexpr (std::endian::native == std::endian::big) {
      for (std::uint16_t& t : tokens16_) t = static_cast<std::uint16_t>(t >> 8 | t << 8);
    }
    check_tokens(std::span<const std::uint16_t>(tokens16_), vocab, path);
  }
}

TokenFile::TokenFile(std::vector<std::uint16_t> tokens, int vocab, std::string name)
    : tokens16_(std::move(tokens)), vocab_(vocab), name_(std::move(name)) {
  check_vocab(vocab, name_);
  check_tokens(std::span<const std::uint16_t>(tokens16_), vocab, name_);
}

TokenFile::TokenFile(std::vector<std::uint32_t> tokens, int vocab, std::string name)
    : wide_(true), tokens32_(std::move(tokens)), vocab_(vocab), name_(std::move(name)) {
  check_vocab(vocab, name_);
  check_tokens(std::span<const std::uint32_t>(tokens32_), vocab, name_);
}

std::vector<std::uint32_t> TokenFile::tokens() const {
  return wide_ ? tokens32_ : std::vector<std::uint32_t>(tokens16_.begin(), tokens16_.end());
}

long long TokenFile::checked_step_tokens(long long step, int B, int T) const {
  const auto n = static_cast<long long>(size());
  const long long bt = step_tokens(B, T, step, name_, LLONG_MAX - 1);
  if (bt + 1 > n) {
    throw InputError(name_, 0, "tokens",
                     "the file holds " + std::to_string(n) + " tokens; a step of B = " + std::to_string(B) +
                         " samples of T = " + std::to_string(T) + " tokens reads B*T + 1 = " +
                         std::to_string(bt + 1));
  }
  return bt;
}

long long TokenFile::position(long long step, int B, int T) const {
  const long long bt = checked_step_tokens(step, B, T);
  // llm.c advances by B*T and wraps to 0 before a read that would pass the end, so the
  // positions it visits are 0, B*T, ..., (m - 1)*B*T with m the most reads that fit.
  const long long positions = (static_cast<long long>(size()) - 1) / bt;
  return step % positions * bt;
}

Batch TokenSource::samples(long long step, int B, int T, int first, int count) const {
  check_samples(B, first, count, describe());
  Batch whole = batch(step, B, T);
  const auto from = static_cast<std::ptrdiff_t>(first) * T, to = from + static_cast<std::ptrdiff_t>(count) * T;
  Batch b;
  b.inputs.assign(whole.inputs.begin() + from, whole.inputs.begin() + to);
  b.targets.assign(whole.targets.begin() + from, whole.targets.begin() + to);
  return b;
}

Batch TokenFile::samples(long long step, int B, int T, int first, int count) const {
  const long long p = position(step, B, T);  // checks B, T and the file's length
  check_samples(B, first, count, name_);
  const long long at = p + static_cast<long long>(first) * T, n = static_cast<long long>(count) * T;
  Batch b;
  const auto take = [&](const auto& tokens) {
    b.inputs.assign(tokens.begin() + at, tokens.begin() + at + n);
    b.targets.assign(tokens.begin() + at + 1, tokens.begin() + at + n + 1);
  };
  if (wide_) {
    take(tokens32_);
  } else {
    take(tokens16_);
  }
  return b;
}

Batch TokenFile::batch(long long step, int B, int T) const {
  const long long p = position(step, B, T);  // checks B, T and the file's length
  const long long bt = static_cast<long long>(B) * T;
  Batch b;
  const auto take = [&](const auto& tokens) {
    b.inputs.assign(tokens.begin() + p, tokens.begin() + p + bt);
    b.targets.assign(tokens.begin() + p + 1, tokens.begin() + p + bt + 1);
  };
  if (wide_) {
    take(tokens32_);
  } else {
    take(tokens16_);
  }
  return b;
}

std::string TokenFile::describe() const {
  return "llm.c token file " + name_ + ": " + std::to_string(size()) + (wide_ ? " uint32" : "") + " tokens, vocabulary " +
         std::to_string(vocab_);
}

std::unique_ptr<TokenSource> open_token_file(const std::string& path, int vocab) {
  return std::make_unique<TokenFile>(path, vocab);
}

std::string encode_token_file(std::span<const int> tokens, const std::string& file, TokenFormat format) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    throw InputError(file, 0, "tokens", std::to_string(tokens.size()) + " tokens: more than a header can count");
  }
  const bool wide = format == TokenFormat::llama3;
  const size_t width = wide ? 4 : 2;
  std::string out(kHeaderBytes + width * tokens.size(), '\0');
  auto* data = reinterpret_cast<unsigned char*>(out.data());
  store_le32(static_cast<std::uint32_t>(wide ? kLlama3TokenFileMagic : kTokenFileMagic), data);
  store_le32(static_cast<std::uint32_t>(wide ? kLlama3TokenFileVersion : kTokenFileVersion), data + 4);
  store_le32(static_cast<std::uint32_t>(tokens.size()), data + 8);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || (!wide && tokens[i] > 0xffff)) {
      throw InputError(file, 0, "tokens[" + std::to_string(i) + "]",
                       "token " + std::to_string(tokens[i]) + " does not fit a " + (wide ? "uint32" : "uint16"));
    }
    unsigned char* at = data + kHeaderBytes + width * i;
    if (wide) {
      store_le32(static_cast<std::uint32_t>(tokens[i]), at);
    } else {
      store_le16(static_cast<std::uint16_t>(tokens[i]), at);
    }
  }
  return out;
}

void write_token_file(const std::string& path, std::span<const int> tokens, TokenFormat format) {
  const std::string bytes = encode_token_file(tokens, path, format);
  AtomicFile out(path);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

// ---- the synthetic Markov stream -----------------------------------------------------------

MarkovStream::MarkovStream(int vocab, std::uint64_t seed, int successors) : vocab_(vocab), seed_(seed) {
  if (vocab < 1 || vocab > model::limits::kMaxVocab) {
    throw InputError(kStreamName, 0, "vocab",
                     std::to_string(vocab) + ": expected 1 to " + std::to_string(model::limits::kMaxVocab));
  }
  if (successors < 1 || successors > kMaxSuccessors) {
    throw InputError(kStreamName, 0, "successors",
                     std::to_string(successors) + ": expected 1 to " + std::to_string(kMaxSuccessors));
  }
  const int k = std::min(successors, vocab);
  SplitMix rng{seed};

  // Sattolo's shuffle: a uniformly drawn permutation with a single cycle. With o_1 = 0,
  // every token leads to every other along that cycle, so the chain is irreducible.
  perm_.resize(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) perm_[static_cast<size_t>(i)] = i;
  for (int i = vocab - 1; i > 0; --i) {
    std::swap(perm_[static_cast<size_t>(i)], perm_[rng.below(static_cast<std::uint64_t>(i))]);
  }

  offsets_.push_back(0);
  while (static_cast<int>(offsets_.size()) < k) {
    const int o = static_cast<int>(rng.below(static_cast<std::uint64_t>(vocab)));
    if (std::find(offsets_.begin(), offsets_.end(), o) == offsets_.end()) offsets_.push_back(o);
  }

  // Weights in 1..1000 scaled to sum to exactly 2^32, so that 32 bits of a hash choose a
  // successor with exactly the probability entropy_nats() assumes.
  std::vector<std::uint64_t> raw;
  std::uint64_t raw_total = 0;
  for (int j = 0; j < k; ++j) raw_total += raw.emplace_back(1 + rng.below(1000));
  std::uint64_t cumulative = 0;
  for (int j = 0; j < k; ++j) {
    // Every weight is at least 2^32 / (1000 k) > 0; the last takes what rounding left.
    const std::uint64_t w = j + 1 < k ? raw[static_cast<size_t>(j)] * kWeightTotal / raw_total : kWeightTotal - cumulative;
    cumulative += w;
    thresholds_.push_back(cumulative);
    const double p = static_cast<double>(w) / static_cast<double>(kWeightTotal);
    probabilities_.push_back(p);
    entropy_nats_ -= p * std::log(p);
  }

  // The first token, uniform over the vocabulary: from it on, every position is uniform.
  SplitMix start{mix(seed ^ 0x5f3759df5f3759dfULL)};
  checkpoints_.push_back(static_cast<int>(start.below(static_cast<std::uint64_t>(vocab))));
}

int MarkovStream::next(int token, long long position) const {
  // The choice after `position` hashes the seed with the position: a token depends only on
  // the one before it and where it is, so any stretch can be generated from a checkpoint.
  const std::uint64_t u =
      mix(seed_ + kGamma * (static_cast<std::uint64_t>(position) + 1)) & (kWeightTotal - 1);
  const size_t j = static_cast<size_t>(std::upper_bound(thresholds_.begin(), thresholds_.end(), u) - thresholds_.begin());
  int x = token + offsets_[j];
  if (x >= vocab_) x -= vocab_;
  return perm_[static_cast<size_t>(x)];
}

int MarkovStream::token_at_checkpoint(long long checkpoint) const {
  std::lock_guard lock(mutex_);
  while (static_cast<long long>(checkpoints_.size()) <= checkpoint) {
    const long long from = static_cast<long long>(checkpoints_.size() - 1) * kCheckpointTokens;
    int x = checkpoints_.back();
    for (long long i = 0; i < kCheckpointTokens; ++i) x = next(x, from + i);
    checkpoints_.push_back(x);
  }
  return checkpoints_[static_cast<size_t>(checkpoint)];
}

std::vector<int> MarkovStream::tokens(long long begin, long long count) const {
  if (begin < 0 || count < 0 || count > kMaxStepTokens + 1 || begin > LLONG_MAX - count) {
    throw InputError(kStreamName, 0, "tokens",
                     "[" + std::to_string(begin) + ", +" + std::to_string(count) + ") is not a range of the stream");
  }
  std::vector<int> out;
  if (count == 0) return out;
  out.reserve(static_cast<size_t>(count));
  const long long checkpoint = begin / kCheckpointTokens;
  int x = token_at_checkpoint(checkpoint);
  for (long long at = checkpoint * kCheckpointTokens; at < begin; ++at) x = next(x, at);
  out.push_back(x);
  for (long long at = begin; at + 1 < begin + count; ++at) out.push_back(x = next(x, at));
  return out;
}

Batch MarkovStream::batch(long long step, int B, int T) const {
  const long long bt = step_tokens(B, T, step, kStreamName, kMaxStepTokens);
  if (step > (LLONG_MAX - bt - 1) / bt) {
    throw InputError(kStreamName, 0, "step", std::to_string(step) + " is beyond the stream's positions");
  }
  return batch_of(tokens(step * bt, bt + 1), bt);
}

Batch MarkovStream::samples(long long step, int B, int T, int first, int count) const {
  const long long bt = step_tokens(B, T, step, kStreamName, kMaxStepTokens);
  if (step > (LLONG_MAX - bt - 1) / bt) {
    throw InputError(kStreamName, 0, "step", std::to_string(step) + " is beyond the stream's positions");
  }
  check_samples(B, first, count, kStreamName);
  const long long n = static_cast<long long>(count) * T;
  return batch_of(tokens(step * bt + static_cast<long long>(first) * T, n + 1), n);
}

std::string MarkovStream::describe() const {
  std::ostringstream s;
  s << "markov stream: vocabulary " << vocab_ << ", seed " << seed_ << ", " << offsets_.size()
    << " successors a token, entropy rate " << std::setprecision(6) << entropy_nats_ << " nats/token";
  return s.str();
}

std::vector<int> MarkovStream::successors(int token) const {
  if (token < 0 || token >= vocab_) {
    throw InputError(kStreamName, 0, "token", std::to_string(token) + " is not in the vocabulary");
  }
  std::vector<int> out;
  for (const int o : offsets_) out.push_back(perm_[static_cast<size_t>((token + o) % vocab_)]);
  return out;
}

std::unique_ptr<MarkovStream> markov_stream(int vocab, std::uint64_t seed) {
  return std::make_unique<MarkovStream>(vocab, seed);
}

}  // namespace hetflow::exec
