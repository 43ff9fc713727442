#include "partition/collective.hpp"

#include <iterator>
#include <stdexcept>
#include <string>

namespace hetflow::partition {

namespace {
constexpr std::string_view kKinds[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"};
constexpr std::string_view kAlgorithms[] = {"ring", "tree", "hierarchical"};

template <typename Enum, size_t N>
Enum parse_name(std::string_view text, const std::string_view (&names)[N], const char* what) {
  std::string accepted;
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == text) return static_cast<Enum>(i);
    accepted += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(names[i]);
  }
  throw std::invalid_argument(std::string("expected ") + what + " " + accepted + ", found '" + std::string(text) + "'");
}
}  // namespace

std::string_view to_string(CollectiveKind k) { return kKinds[static_cast<size_t>(k)]; }
std::string_view to_string(CollectiveAlgorithm a) { return kAlgorithms[static_cast<size_t>(a)]; }

CollectiveKind parse_collective_kind(std::string_view text) {
  return parse_name<CollectiveKind>(text, kKinds, "a collective kind:");
}
CollectiveAlgorithm parse_collective_algorithm(std::string_view text) {
  return parse_name<CollectiveAlgorithm>(text, kAlgorithms, "an algorithm:");
}

}  // namespace hetflow::partition
