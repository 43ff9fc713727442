#include "partition/routing.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include "model/error.hpp"
#include "model/units.hpp"

namespace hetflow::partition {

namespace {

// A finite number >= 0 (the whole of `text`), or nothing.
bool read_number(std::string_view text, double& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && std::isfinite(out) && out >= 0;
}

}  // namespace

Routing parse_routing(std::string_view text, const std::string& file, const std::string& field) {
  auto fail = [&](const std::string& why) {
    throw InputError(file, 0, field, why + " (balanced, zipf:<exponent> or histogram:<tokens>,<tokens>,...)");
  };
  Routing r;
  if (text == "balanced") return r;
  if (text.rfind("zipf:", 0) == 0) {
    r.kind = Routing::Kind::zipf;
    if (!read_number(text.substr(5), r.zipf_exponent) || r.zipf_exponent <= 0 || r.zipf_exponent > 100) {
      fail("expected a Zipf exponent in (0, 100] after 'zipf:', found '" + std::string(text.substr(5)) + "'");
    }
    return r;
  }
  if (text.rfind("histogram:", 0) == 0) {
    r.kind = Routing::Kind::histogram;
    std::string_view rest = text.substr(10);
    while (true) {
      const size_t comma = rest.find(',');
      double count = 0;
      if (!read_number(rest.substr(0, comma), count) || count > 1e30) {
        fail("expected token counts >= 0 separated by commas, found '" + std::string(rest.substr(0, comma)) + "'");
      }
      r.histogram.push_back(count);
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
    if (std::accumulate(r.histogram.begin(), r.histogram.end(), 0.0) <= 0) fail("expected some tokens in the histogram");
    return r;
  }
  fail("expected a routing model, found '" + std::string(text.substr(0, 40)) + "'");
  return r;
}

std::string to_string(const Routing& r) {
  switch (r.kind) {
    case Routing::Kind::balanced: return "balanced";
    case Routing::Kind::zipf: return "zipf:" + model::units::format_number(r.zipf_exponent);
    case Routing::Kind::histogram: {
      std::string out = "histogram:";
      for (size_t i = 0; i < r.histogram.size(); ++i) out += (i ? "," : "") + model::units::format_number(r.histogram[i]);
      return out;
    }
  }
  return "balanced";
}

std::vector<double> expert_shares(const Routing& r, int experts) {
  std::vector<double> shares(static_cast<size_t>(std::max(experts, 0)), 0.0);
  if (experts <= 0) return shares;
  switch (r.kind) {
    case Routing::Kind::balanced:
      std::fill(shares.begin(), shares.end(), 1.0 / experts);
      return shares;
    case Routing::Kind::zipf:
      for (int i = 0; i < experts; ++i) shares[static_cast<size_t>(i)] = std::pow(i + 1.0, -r.zipf_exponent);
      break;
    case Routing::Kind::histogram:
      if (r.histogram.size() != shares.size()) {
        throw InputError("<routing>", 0, "routing",
                         "the histogram counts " + std::to_string(r.histogram.size()) + " experts; the layers have " +
                             std::to_string(experts));
      }
      shares = r.histogram;
      break;
  }
  const double total = std::accumulate(shares.begin(), shares.end(), 0.0);
  for (double& s : shares) s /= total;
  return shares;
}

ExpertPlacement contiguous_placement(int experts, int ranks) {
  ExpertPlacement p;
  p.ranks = std::max(ranks, 1);
  const int per_rank = std::max(experts / p.ranks, 1);
  for (int e = 0; e < experts; ++e) p.rank_of.push_back(std::min(e / per_rank, p.ranks - 1));
  return p;
}

ExpertPlacement placement_by_speed(const std::vector<double>& shares, const std::vector<double>& speeds,
                                   const std::vector<int>& max_experts) {
  const size_t ranks = speeds.size();
  ExpertPlacement p;
  p.ranks = static_cast<int>(ranks);
  p.rank_of.assign(shares.size(), 0);
  if (ranks == 0 || max_experts.size() != ranks) {
    throw InputError("<placement>", 0, "speeds", "expected one speed and one expert limit per expert-parallel rank");
  }
  long long room = 0;
  for (int cap : max_experts) room += std::max(cap, 0);
  if (room < static_cast<long long>(shares.size())) {
    throw InputError("<placement>", 0, "experts",
                     std::to_string(shares.size()) + " experts do not fit the ranks' memory (" + std::to_string(room) +
                         " in all)");
  }
  // Heaviest first; ties in expert order, so the result is the same on every machine.
  std::vector<size_t> order(shares.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return shares[a] > shares[b]; });
  std::vector<double> load(ranks, 0.0);
  std::vector<int> held(ranks, 0);
  for (size_t e : order) {
    size_t best = ranks;
    double best_time = 0;
    for (size_t r = 0; r < ranks; ++r) {
      if (held[r] >= max_experts[r] || !(speeds[r] > 0)) continue;
      // The finish time after it; among equals the rank holding fewer experts (so balanced
      // shares spread evenly), then the lower rank.
      const double time = (load[r] + shares[e]) / speeds[r];
      if (best == ranks || time < best_time * (1 - 1e-12) ||
          (time <= best_time * (1 + 1e-12) && held[r] < held[best])) {
        best = r;
        best_time = time;
      }
    }
    if (best == ranks) throw InputError("<placement>", 0, "speeds", "expected speeds > 0 on ranks with room for experts");
    p.rank_of[e] = static_cast<int>(best);
    load[best] += shares[e];
    ++held[best];
  }
  return p;
}

ExpertLoads expert_loads(const std::vector<double>& shares, const ExpertPlacement& placement, double capacity_factor) {
  ExpertLoads out;
  out.rank_load.assign(static_cast<size_t>(std::max(placement.ranks, 1)), 0.0);
  const double experts = static_cast<double>(shares.size());
  double kept = 0;
  for (size_t e = 0; e < shares.size(); ++e) {
    // Each rank sends expert e its share of its copies, at most capacity_factor / experts of them.
    const double taken = capacity_factor > 0 ? std::min(shares[e], capacity_factor / experts) : shares[e];
    kept += taken;
    const int rank = e < placement.rank_of.size() ? placement.rank_of[e] : 0;
    out.rank_load[static_cast<size_t>(std::clamp(rank, 0, placement.ranks - 1))] += placement.ranks * taken;
  }
  out.dropped = std::max(0.0, 1 - kept);
  out.busiest = static_cast<int>(std::max_element(out.rank_load.begin(), out.rank_load.end()) - out.rank_load.begin());
  return out;
}

}  // namespace hetflow::partition
