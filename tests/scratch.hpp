#pragma once
// Scratch files for tests: a per-process temporary folder, removed when the process exits.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace hetflow::test_support {

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::filesystem::path scratch_dir() {
  // One per test process (ctest runs each test in its own). A simulation's child process
  // leaves with _exit and never runs this destructor; the test process does, at exit.
  struct Scratch {
    std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("hetflow-test-" + std::to_string(::getpid()));
    ~Scratch() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  };
  static const Scratch scratch;
  std::filesystem::create_directories(scratch.dir);
  return scratch.dir;
}

inline std::string write_file(const std::string& name, const std::string& text) {
  const auto path = scratch_dir() / name;
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace hetflow::test_support
