// Exact minimum-bottleneck contiguous partitioning, in passes over the (stage, first, last)
// triples, O(S * L^2) callback calls in all:
//  1. forward DP for the smallest bottleneck B:
//       best[s][j] = min over i of max(best[s-1][i], stage_time_s(s-1, i, j)), where it fits;
//  2. forward DP for the smallest sum of stage times among partitions whose stages all take
//     <= B (so their bottleneck is exactly B). The sum is the double accumulated from stage 0
//     onwards; x <= y implies x + t <= y + t in floating point, so prefix minima give the
//     exact minimum. (One DP on the pair (bottleneck, sum) would not be exact: a prefix with
//     a larger bottleneck but a smaller sum wins when a later stage sets the bottleneck.)
//  3. the lexicographically smallest boundaries reaching that sum. Rounding can let a prefix
//     with a larger sum reach the same total, so a backward pass computes, for each
//     (stage, layer), the largest prefix sum from which that total is still reachable, and the
//     boundaries are then picked greedily from the front, smallest first.
// Doubles are compared exactly (no epsilon). A stage whose time is not finite (inf, NaN) is
// treated as not fitting. nullopt when layers < 1, stages < 1, stages > layers, or when no
// partition into non-empty stages fits.
#include "partition/partitioner.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace hetflow::partition {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
using Table = std::vector<std::vector<double>>;

// Maps non-NaN doubles onto integers in the same order, and back.
std::int64_t to_ordered(double x) {
  const auto bits = std::bit_cast<std::int64_t>(x);
  return bits >= 0 ? bits : -(bits & std::numeric_limits<std::int64_t>::max());
}
double from_ordered(std::int64_t o) {
  return o >= 0 ? std::bit_cast<double>(o) : -std::bit_cast<double>(-o);
}

// The largest double p with p + t <= limit (computed in double); p + t is non-decreasing in p
// and -inf always qualifies, so a binary search over the ordered doubles finds it.
double largest_prefix(double t, double limit) {
  // limit - t is within an ulp or two of the answer: step from it, in the order of the
  // doubles, while that lasts (the binary search below takes 64 halvings every time).
  if (std::isfinite(t) && std::isfinite(limit)) {
    double p = limit - t;
    for (int step = 0; step < 16 && std::isfinite(p); ++step) {
      if (p + t <= limit) {
        const double up = std::nextafter(p, kInf);
        if (!(up + t <= limit)) return p;
        p = up;
      } else {
        p = std::nextafter(p, -kInf);
      }
    }
  }
  std::int64_t lo = to_ordered(-kInf), hi = to_ordered(kInf);
  while (lo < hi) {
    const auto span = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo);
    const std::int64_t mid = lo + static_cast<std::int64_t>((span + 1) / 2);
    if (from_ordered(mid) + t <= limit) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return from_ordered(lo);
}

}  // namespace

std::optional<Partition> partition_min_bottleneck(const PartitionProblem& problem) {
  const int L = problem.layers, S = problem.stages;
  if (L < 1 || S < 1 || S > L) return std::nullopt;

  // Stage s = [i, j): its time, or nullopt when it does not fit. Asked for once each (the
  // passes below ask three times): NaN marks one not asked yet, +inf one that does not fit.
  const auto at = [L](int s, int i, int j) {
    return (static_cast<size_t>(s) * static_cast<size_t>(L + 1) + static_cast<size_t>(i)) * static_cast<size_t>(L + 1) +
           static_cast<size_t>(j);
  };
  std::vector<double> times(static_cast<size_t>(S) * static_cast<size_t>(L + 1) * static_cast<size_t>(L + 1),
                            std::numeric_limits<double>::quiet_NaN());
  auto time = [&](int s, int i, int j) -> std::optional<double> {
    double& t = times[at(s, i, j)];
    if (std::isnan(t)) {
      t = problem.fits(s, i, j) ? problem.stage_time_s(s, i, j) : kInf;
      if (!std::isfinite(t)) t = kInf;
    }
    return t == kInf ? std::nullopt : std::optional(t);
  };
  // Calls f(i, j, t) for every fitting stage s = [i, j) that leaves each other stage a layer.
  auto for_each_stage = [&](int s, auto&& f) {
    for (int j = s + 1; j <= L - (S - 1 - s); ++j) {
      for (int i = s; i < j; ++i) {
        if (const auto t = time(s, i, j)) f(i, j, *t);
      }
    }
  };

  // 1. Smallest bottleneck; best[s][j] covers layers [0, j) with s stages (+inf: impossible).
  Table best(S + 1, std::vector<double>(L + 1, kInf));
  best[0][0] = -kInf;
  for (int s = 0; s < S; ++s) {
    for_each_stage(s, [&](int i, int j, double t) {
      if (best[s][i] != kInf) best[s + 1][j] = std::min(best[s + 1][j], std::max(best[s][i], t));
    });
  }
  const double bottleneck = best[S][L];
  if (bottleneck == kInf) return std::nullopt;

  // 2. Smallest sum of stage times with every stage <= bottleneck.
  Table sum(S + 1, std::vector<double>(L + 1, kInf));
  sum[0][0] = 0;
  for (int s = 0; s < S; ++s) {
    for_each_stage(s, [&](int i, int j, double t) {
      if (t <= bottleneck) sum[s + 1][j] = std::min(sum[s + 1][j], sum[s][i] + t);
    });
  }

  // 3. limit[s][i]: the largest sum of the first s stages, ending at layer i, from which the
  //    rest can still reach the smallest sum (-inf: from none).
  Table limit(S + 1, std::vector<double>(L + 1, -kInf));
  limit[S][L] = sum[S][L];
  for (int s = S - 1; s >= 0; --s) {
    for_each_stage(s, [&](int i, int j, double t) {
      if (t <= bottleneck && limit[s + 1][j] != -kInf) {
        limit[s][i] = std::max(limit[s][i], largest_prefix(t, limit[s + 1][j]));
      }
    });
  }

  // Greedy from the front: each boundary as small as the smallest sum still allows.
  Partition result{{0}, bottleneck};
  double prefix = 0;
  for (int s = 0; s < S; ++s) {
    const int i = result.boundaries.back();
    for (int j = i + 1; j <= L - (S - 1 - s); ++j) {
      const auto t = time(s, i, j);
      if (t && *t <= bottleneck && prefix + *t <= limit[s + 1][j]) {
        prefix += *t;
        result.boundaries.push_back(j);
        break;
      }
    }
  }
  return result;
}

}  // namespace hetflow::partition
