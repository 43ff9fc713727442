// Dollar figures and their sources. The defaults describe an H100 fleet; another GPU needs
// its own prices (--usd-per-gpu-hour, --gpu-price, --watts-per-gpu).
#include "campaign/cost.hpp"

namespace hetflow::campaign {

namespace {

// Rent: AWS p5.48xlarge (8 H100 SXM) on demand in us-east-1, 98.32 USD per hour in AWS's
// 2024 price list: 12.29 USD per GPU-hour.
constexpr double kRentUsdPerGpuHour = 98.32 / 8;
// Buy: an H100 sold for 25,000 to 40,000 USD in 2023 (CNBC, "Nvidia's H100 chip...", Apr.
// 2023); we take 30,000. Host, network and building are not included.
constexpr double kGpuPriceUsd = 30000;
// Amortised over 5.5 years, the useful life Meta gives its servers and network assets from
// January 2025 (Meta Platforms 10-K for 2024, note on property and equipment).
constexpr double kLifetimeS = 5.5 * 365.25 * 86400;
// A DGX H100 draws at most 10.2 kW for its 8 GPUs (NVIDIA DGX H100 datasheet): 1,275 W each.
constexpr double kWattsPerGpu = 10200.0 / 8;
// Facility overhead: the average PUE of the Uptime Institute's Global Data Center Survey
// 2023, 1.58.
constexpr double kPue = 1.58;
// Electricity: the US average retail price to industry in 2023, 8.04 cents per kWh (US EIA,
// Electric Power Monthly, table 5.3).
constexpr double kUsdPerKwh = 0.0804;

}  // namespace

CostOptions default_cost_options(double cluster_usd_per_gpu_hour) {
  CostOptions o;
  o.usd_per_gpu_hour = cluster_usd_per_gpu_hour > 0 ? cluster_usd_per_gpu_hour : kRentUsdPerGpuHour;
  o.gpu_price_usd = kGpuPriceUsd;
  o.lifetime_s = kLifetimeS;
  o.watts_per_gpu = kWattsPerGpu;
  o.pue = kPue;
  o.usd_per_kwh = kUsdPerKwh;
  return o;
}

Cost campaign_cost(const CostOptions& o, double gpus, double wall_s) {
  Cost c;
  const double hours = wall_s / 3600;
  if (o.mode == CostOptions::Mode::rent) {
    c.usd_per_hour = gpus * o.usd_per_gpu_hour;
  } else {
    const double kw = gpus * o.watts_per_gpu * o.pue / 1000;
    c.usd_per_hour = gpus * o.gpu_price_usd / (o.lifetime_s / 3600) + kw * o.usd_per_kwh;
    c.energy_kwh = kw * hours;
  }
  c.usd = c.usd_per_hour * hours;
  return c;
}

}  // namespace hetflow::campaign
