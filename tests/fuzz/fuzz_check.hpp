#pragma once
// What every fuzz target shares. A target feeds its input to one reader and lets through
// only hetflow's own refusal (InputError, naming the file); anything else that leaves the
// reader (a library's exception, std::bad_alloc, std::out_of_range), a crash or undefined
// behaviour is a finding. What a reader accepts is written back and read again where the
// format promises a lossless round trip; FUZZ_CHECK aborts, naming the broken promise.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/error.hpp"

#define FUZZ_CHECK(condition)                                                                        \
  do {                                                                                               \
    if (!(condition)) {                                                                              \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #condition);       \
      std::abort();                                                                                  \
    }                                                                                                \
  } while (0)

namespace hetflow::fuzz {

inline std::string text_of(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// A refusal must name where the input came from (the file, or a part of it) and must
// not pass a library's words on to the user (words the input holds itself may be quoted).
inline void check_refusal(const InputError& e, const std::string& file, const std::string& input) {
  const std::string what = e.what();  // up to a NUL the input may hold
  if (e.file().rfind(file, 0) != 0) {
    std::fprintf(stderr, "refusal does not name %s: %s\n", file.c_str(), what.c_str());
    std::abort();
  }
  for (const char* words : {"json.exception", "yaml-cpp", "std::", "stod", "stoi", "what():"}) {
    if (what.find(words) != std::string::npos && input.find(words) == std::string::npos) {
      std::fprintf(stderr, "refusal passes a library's words on (%s): %s\n", words, what.c_str());
      std::abort();
    }
  }
}

}  // namespace hetflow::fuzz
