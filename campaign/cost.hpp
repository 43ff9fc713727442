#pragma once
// What a campaign costs in dollars: GPUs rented by the hour, or bought (the purchase
// amortised over their lifetime) and powered. Defaults are cited in cost.cpp.
#include <string>

namespace hetflow::campaign {

struct CostOptions {
  enum class Mode { rent, buy } mode = Mode::rent;
  double usd_per_gpu_hour = 0;    // rent
  double gpu_price_usd = 0;       // buy: purchase price per GPU
  double lifetime_s = 0;          // buy: over which the purchase is amortised
  double watts_per_gpu = 0;       // buy: the GPU's share of its server's power
  double pue = 1;                 // buy: facility power over IT power
  double usd_per_kwh = 0;         // buy
};

// The defaults: rent at `cluster_usd_per_gpu_hour` when the cluster file gives node prices
// (0: the cited default).
CostOptions default_cost_options(double cluster_usd_per_gpu_hour = 0);

struct Cost {
  double usd = 0;
  double usd_per_hour = 0;  // for the whole fleet
  double energy_kwh = 0;    // buy: facility energy
};

// Cost of holding `gpus` GPUs (spares included) for `wall_s`.
Cost campaign_cost(const CostOptions& options, double gpus, double wall_s);

}  // namespace hetflow::campaign
