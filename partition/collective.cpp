#include "partition/collective.hpp"

#include <iterator>
#include <stdexcept>
#include <string>

#include "model/error.hpp"

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

bool supports(CollectiveKind kind, CollectiveAlgorithm algorithm) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return true;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
      return algorithm != CollectiveAlgorithm::tree;
    case CollectiveKind::broadcast:
    case CollectiveKind::reduce:
      return algorithm != CollectiveAlgorithm::hierarchical;
  }
  return false;
}

void check_collective(const CollectiveSpec& c) {
  if (!supports(c.kind, c.algorithm)) {
    std::string accepted;
    for (auto a : {CollectiveAlgorithm::ring, CollectiveAlgorithm::tree, CollectiveAlgorithm::hierarchical}) {
      if (supports(c.kind, a)) accepted += (accepted.empty() ? "" : " or ") + std::string(to_string(a));
    }
    throw Error(std::string(to_string(c.kind)) + " has no " + std::string(to_string(c.algorithm)) +
                " algorithm; use " + accepted);
  }
  if (c.messages < 1) {
    throw Error(std::string(to_string(c.kind)) + ": expected at least 1 message, found " + std::to_string(c.messages));
  }
  if (c.root < 0 || (!c.devices.empty() && static_cast<size_t>(c.root) >= c.devices.size())) {
    throw Error(std::string(to_string(c.kind)) + ": root " + std::to_string(c.root) + " is not an index into its " +
                std::to_string(c.devices.size()) + " participants");
  }
}

}  // namespace hetflow::partition
