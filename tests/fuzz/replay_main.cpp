// The driver a fuzz target is linked with where libFuzzer is not (gcc builds, CI): runs every
// corpus file through LLVMFuzzerTestOneInput, then a bounded, deterministic number of
// mutants of them (byte flips, insertions, deletions, duplicated ranges, splices of two
// files, numbers made extreme), so the test suite exercises each target in seconds. The
// clang build (HETFLOW_FUZZ) links the same targets with libFuzzer instead (tools/fuzz.sh).
//
//   fuzz_replay_<reader> [--mutations N] [--seed S] [--crash FILE] PATH...
//
// PATHs are files or folders (their files, in name order). An input that aborts or crashes
// is written to --crash FILE (default: crash-<reader>-input in the working folder) and named
// on stderr with the corpus file and mutation that made it; rerun it with that file as the
// only PATH and --mutations 0.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

struct Input {
  std::string name;
  std::string bytes;
};

// What runs now, for the crash report (plain globals: read by a signal handler).
const std::string* g_current = nullptr;
std::string g_description;
std::string g_crash_file;

void report_crash() {
  if (g_current == nullptr) return;
  std::fprintf(stderr, "fuzz replay: the input that failed: %s (%zu bytes), written to %s\n", g_description.c_str(),
               g_current->size(), g_crash_file.c_str());
  if (FILE* f = std::fopen(g_crash_file.c_str(), "wb")) {
    std::fwrite(g_current->data(), 1, g_current->size(), f);
    std::fclose(f);
  }
  g_current = nullptr;  // reported once, whichever of terminate and the signal handler comes first
}

void on_signal(int sig) {
  report_crash();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// SplitMix64: small, and the same sequence on every platform and standard library (the
// <random> distributions are not).
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
};

// Bytes that matter to the formats read here: structure, separators, signs, digits, units.
const char kInteresting[] = "{}[]\":,'\n\r\t -+.0123456789eE#&*!|>@xX\\\0";
const char* const kTokens[] = {"-1", "0", "1e308", "-1e308", "nan", "inf", "1e-320", "4294967296", "2147483648",
                               "9223372036854775808", "99999999999999999999", "null", "true", "[]", "{}", "\"\"",
                               "~", "&a", "*a", "<<: ", "0x7fffffff", "1e9", "100000"};

std::string mutate(const std::vector<Input>& corpus, Rng& rng, std::string s) {
  const int ops = 1 + static_cast<int>(rng.below(4));
  for (int op = 0; op < ops; ++op) {
    const size_t at = rng.below(s.size() + 1);
    switch (rng.below(7)) {
      case 0:  // flip a bit
        if (!s.empty()) s[std::min(at, s.size() - 1)] ^= static_cast<char>(1u << rng.below(8));
        break;
      case 1:  // insert a byte that matters
        s.insert(at, 1, kInteresting[rng.below(sizeof kInteresting - 1)]);
        break;
      case 2:  // insert a random byte
        s.insert(at, 1, static_cast<char>(rng.below(256)));
        break;
      case 3:  // delete a range
        s.erase(at, 1 + rng.below(16));
        break;
      case 4: {  // duplicate a range
        const size_t n = std::min<size_t>(1 + rng.below(64), s.size() - std::min(at, s.size()));
        s.insert(at, s.substr(at, n));
        break;
      }
      case 5: {  // splice: this input's head, another's tail
        const std::string& other = corpus[rng.below(corpus.size())].bytes;
        s = s.substr(0, at) + other.substr(rng.below(other.size() + 1));
        break;
      }
      default: {  // replace the number at a random digit with an extreme token
        const size_t digit = s.find_first_of("0123456789", at);
        if (digit == std::string::npos) break;
        size_t end = digit;
        while (end < s.size() && (std::isdigit(static_cast<unsigned char>(s[end])) || s[end] == '.')) ++end;
        s.replace(digit, end - digit, kTokens[rng.below(std::size(kTokens))]);
        break;
      }
    }
  }
  return s;
}

double g_slowest_s = 0;
std::string g_slowest;

void run(const std::string& bytes, const std::string& description) {
  g_current = &bytes;
  g_description = description;
  const auto start = std::chrono::steady_clock::now();
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (seconds > g_slowest_s) {
    g_slowest_s = seconds;
    g_slowest = description;
  }
  g_current = nullptr;
}

int usage() {
  std::cerr << "usage: fuzz_replay_<reader> [--mutations N] [--seed S] [--crash FILE] PATH...\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  long long mutations = 1000;
  uint64_t seed = 1;
  const std::string program = fs::path(argv[0]).filename().string();
  const std::string prefix = "fuzz_replay_";
  g_crash_file = "crash-" + (program.rfind(prefix, 0) == 0 ? program.substr(prefix.size()) : program) + "-input";
  std::vector<fs::path> files;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if ((arg == "--mutations" || arg == "--seed" || arg == "--crash") && i + 1 < argc) {
        const std::string value = argv[++i];
        if (arg == "--mutations") mutations = std::stoll(value);
        if (arg == "--seed") seed = std::stoull(value);
        if (arg == "--crash") g_crash_file = value;
      } else if (arg.rfind("--", 0) == 0) {
        return usage();
      } else if (fs::is_directory(arg)) {
        std::vector<fs::path> in_folder;
        for (const auto& entry : fs::directory_iterator(arg)) {
          if (entry.is_regular_file()) in_folder.push_back(entry.path());
        }
        std::sort(in_folder.begin(), in_folder.end());
        files.insert(files.end(), in_folder.begin(), in_folder.end());
      } else if (fs::is_regular_file(arg)) {
        files.emplace_back(arg);
      } else {
        std::cerr << "fuzz replay: no such file or folder: " << arg << "\n";
        return 2;
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "fuzz replay: bad argument: " << e.what() << "\n";
    return usage();
  }
  if (files.empty()) return usage();

  std::vector<Input> corpus;
  for (const fs::path& path : files) {
    std::ifstream in(path, std::ios::binary);
    corpus.push_back({path.string(), std::string(std::istreambuf_iterator<char>(in), {})});
  }
  std::set_terminate([] {
    report_crash();
    if (const std::exception_ptr e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        std::fprintf(stderr, "fuzz replay: an exception escaped the reader: %s\n", x.what());
      } catch (...) {
        std::fprintf(stderr, "fuzz replay: an exception escaped the reader\n");
      }
    }
    std::abort();
  });
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, on_signal);

  const auto start = std::chrono::steady_clock::now();
  for (const Input& input : corpus) run(input.bytes, input.name);
  Rng rng{seed};
  for (long long m = 0; m < mutations; ++m) {
    const Input& base = corpus[rng.below(corpus.size())];
    run(mutate(corpus, rng, base.bytes),
        base.name + ", mutation " + std::to_string(m) + " of --seed " + std::to_string(seed));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz replay: %zu corpus files and %lld mutants in %.2f s, nothing escaped; slowest %.3f s: %s\n",
              corpus.size(), mutations, seconds, g_slowest_s, g_slowest.c_str());
  return 0;
}
