#include "partition/collective.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <stdexcept>
#include <string>

#include "model/error.hpp"

namespace hetflow::partition {

namespace {
constexpr std::string_view kKinds[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "sendrecv"};
constexpr std::string_view kAlgorithms[] = {"ring", "tree", "hierarchical", "pairwise"};

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
  if (kind == CollectiveKind::all_to_all) {
    return algorithm == CollectiveAlgorithm::pairwise || algorithm == CollectiveAlgorithm::hierarchical;
  }
  if (kind == CollectiveKind::sendrecv) return algorithm == CollectiveAlgorithm::ring;
  if (algorithm == CollectiveAlgorithm::pairwise) return false;
  switch (kind) {
    case CollectiveKind::sendrecv:
    case CollectiveKind::all_to_all:
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
    for (auto a : {CollectiveAlgorithm::ring, CollectiveAlgorithm::tree, CollectiveAlgorithm::hierarchical,
                   CollectiveAlgorithm::pairwise}) {
      if (supports(c.kind, a)) accepted += (accepted.empty() ? "" : " or ") + std::string(to_string(a));
    }
    throw Error(std::string(to_string(c.kind)) + " has no " + std::string(to_string(c.algorithm)) +
                " algorithm; use " + accepted);
  }
  if (c.messages < 1) {
    throw Error(std::string(to_string(c.kind)) + ": expected at least 1 message, found " + std::to_string(c.messages));
  }
  if (!c.parts.empty()) {
    const bool sharded = c.kind == CollectiveKind::reduce_scatter || c.kind == CollectiveKind::all_gather;
    if (c.kind != CollectiveKind::all_to_all && !sharded) {
      throw Error(std::string(to_string(c.kind)) +
                  ": parts are an all_to_all's shares or a reduce_scatter's or all_gather's; this kind has none");
    }
    if (sharded && c.algorithm != CollectiveAlgorithm::ring) {
      throw Error(std::string(to_string(c.kind)) + ": uneven parts run on a ring only, found " +
                  std::string(to_string(c.algorithm)));
    }
    const std::string kind(to_string(c.kind));
    double total = 0;
    for (double p : c.parts) {
      if (!(p >= 0) || p > 1) throw Error(kind + ": expected parts in [0, 1], found " + std::to_string(p));
      total += p;
    }
    if (c.parts.size() != c.devices.size() || std::abs(total - 1) > 1e-9) {
      throw Error(kind + ": expected one part per member (" + std::to_string(c.devices.size()) +
                  ") adding up to 1; found " + std::to_string(c.parts.size()) + " adding up to " + std::to_string(total));
    }
  }
  if (c.root < 0 || (!c.devices.empty() && static_cast<size_t>(c.root) >= c.devices.size())) {
    throw Error(std::string(to_string(c.kind)) + ": root " + std::to_string(c.root) + " is not an index into its " +
                std::to_string(c.devices.size()) + " participants");
  }
}

std::vector<double> part_cuts(const std::vector<double>& parts, size_t members) {
  std::vector<double> cuts(members + 1, 1.0);
  double at = 0;
  for (size_t i = 0; i < members; ++i) {
    cuts[i] = parts.empty() ? static_cast<double>(i) / static_cast<double>(members) : std::min(at, 1.0);
    if (i < parts.size()) at += parts[i];
  }
  return cuts;
}

double all_to_all_part(const CollectiveSpec& c, size_t member) {
  if (!c.parts.empty()) return member < c.parts.size() ? c.parts[member] : 0;
  return c.devices.empty() ? 0 : 1.0 / static_cast<double>(c.devices.size());
}

}  // namespace hetflow::partition
