#pragma once
// Scratch files for tests: a per-process temporary folder.
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
  const auto dir = std::filesystem::temp_directory_path() /
                   ("hetflow-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string write_file(const std::string& name, const std::string& text) {
  const auto path = scratch_dir() / name;
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace hetflow::test_support
