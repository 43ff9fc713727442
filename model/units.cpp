#include "model/units.hpp"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace hetflow::model::units {

namespace {

struct Unit {
  std::string_view name;
  double factor;
};

// value in `factor` units -> base units. Sub-unit factors (1e-6, 1/8) divide by their exact
// integer inverse, so "5 us" is the double nearest 5e-6, exactly as the literal 5e-6 is.
double apply(double value, double factor) {
  return factor < 1 ? value / std::round(1 / factor) : value * factor;
}
double unapply(double value, double factor) {
  return factor < 1 ? value * std::round(1 / factor) : value / factor;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits "25 GB/s" into 25 and "GB/s". Throws when there is no leading number.
std::pair<double, std::string_view> split_number(std::string_view text, std::string_view expected) {
  const std::string_view s = trim(text);
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || s.empty()) {
    throw std::invalid_argument("expected " + std::string(expected) + ", found '" + std::string(text) + "'");
  }
  if (!std::isfinite(value)) {
    throw std::invalid_argument("expected a finite number, found '" + std::string(text) + "'");
  }
  return {value, trim(std::string_view(end, static_cast<size_t>(s.data() + s.size() - end)))};
}

// A value that overflows once its unit is applied ("1e308 min") is as unusable as "inf".
double finite_scaled(double value, std::string_view text) {
  if (!std::isfinite(value)) {
    throw std::invalid_argument("expected a finite quantity, found '" + std::string(text) +
                                "' (too large once its unit is applied)");
  }
  return value;
}

// A quantity written without its unit ("bandwidth: 25") is refused rather than read in base
// units: 25 bytes/s where 25 Gb/s was meant made an iteration of months. Zero needs no unit.
void refuse_bare(double value, std::string_view unit, std::string_view text, std::string_view expected,
                 std::string_view accepted) {
  if (unit.empty() && value != 0) {
    throw std::invalid_argument("expected " + std::string(expected) + ", found '" + std::string(text) +
                                "' without a unit (units: " + std::string(accepted) + ")");
  }
}

constexpr std::string_view kByteNames = "B, kB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB; b, kb, Mb, Gb, Tb for bits";
constexpr std::string_view kTimeNames = "s, ms, us, ns, min";
constexpr std::string_view kBandwidthNames = "B/s, kB/s, MB/s, GB/s, TB/s, GiB/s; b/s, Mb/s, Gb/s, Tb/s for bits; or Gbps";
constexpr std::string_view kFlopNames = "FLOP/s, GFLOP/s, TFLOP/s, PFLOP/s (or TFLOPS)";

double parse_with(std::string_view text, std::string_view expected, const Unit* units, size_t n,
                  std::string_view accepted) {
  auto [value, unit] = split_number(text, expected);
  refuse_bare(value, unit, text, expected, accepted);
  if (unit.empty()) return value;
  for (size_t i = 0; i < n; ++i) {
    if (units[i].name == unit) return finite_scaled(apply(value, units[i].factor), text);
  }
  throw std::invalid_argument("expected " + std::string(expected) + ", found unknown unit '" +
                              std::string(unit) + "' in '" + std::string(text) + "'");
}

constexpr double kKi = 1024.0;

constexpr std::array kByteUnits{
    Unit{"B", 1},          Unit{"kB", 1e3},          Unit{"KB", 1e3},
    Unit{"MB", 1e6},       Unit{"GB", 1e9},          Unit{"TB", 1e12},
    Unit{"PB", 1e15},      Unit{"KiB", kKi},         Unit{"MiB", kKi * kKi},
    Unit{"GiB", kKi * kKi * kKi}, Unit{"TiB", kKi * kKi * kKi * kKi}, Unit{"PiB", kKi * kKi * kKi * kKi * kKi},
    Unit{"b", 1.0 / 8},    Unit{"kb", 1e3 / 8},      Unit{"Kb", 1e3 / 8},
    Unit{"Mb", 1e6 / 8},   Unit{"Gb", 1e9 / 8},      Unit{"Tb", 1e12 / 8},
};

constexpr std::array kTimeUnits{
    Unit{"s", 1},     Unit{"ms", 1e-3}, Unit{"us", 1e-6},
    Unit{"µs", 1e-6}, Unit{"ns", 1e-9}, Unit{"min", 60},
};

constexpr std::array kFlopPrefixes{
    Unit{"", 1}, Unit{"K", 1e3}, Unit{"k", 1e3}, Unit{"M", 1e6}, Unit{"G", 1e9},
    Unit{"T", 1e12}, Unit{"P", 1e15}, Unit{"E", 1e18},
};

// Shortest decimal text t with strtod(t) * factor == value exactly, preferring plain
// notation ("80", not "8e+01") for everyday magnitudes.
std::string shortest_scaled(double value, double factor) {
  const double scaled = unapply(value, factor);
  const bool everyday = std::fabs(scaled) >= 1e-4 && std::fabs(scaled) < 1e15;
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, scaled);
    if (everyday && std::strchr(buf, 'e') != nullptr) continue;
    if (apply(std::strtod(buf, nullptr), factor) == value) return buf;
  }
  return {};  // no exact text at this scale
}

std::string shortest(double v) {
  std::string text = shortest_scaled(v, 1);
  if (text.empty()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    text = buf;
  }
  return text;
}

// Largest unit u with value/u >= 1 that reads back exactly.
std::string format_with(double value, std::initializer_list<Unit> largest_first,
                        std::string_view base_unit) {
  if (value != 0 && std::isfinite(value)) {
    for (const Unit& u : largest_first) {
      if (std::fabs(unapply(value, u.factor)) < 1) continue;
      const std::string text = shortest_scaled(value, u.factor);
      if (!text.empty()) return text + " " + std::string(u.name);
    }
  }
  return shortest(value) + " " + std::string(base_unit);
}

std::string human(double value, std::initializer_list<Unit> largest_first, std::string_view base) {
  for (const Unit& u : largest_first) {
    if (std::fabs(value) >= u.factor) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.3g %s", value / u.factor, std::string(u.name).c_str());
      return buf;
    }
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g %s", value, std::string(base).c_str());
  return buf;
}

}  // namespace

double parse_number(std::string_view text) {
  auto [value, rest] = split_number(text, "a number");
  if (!rest.empty()) throw std::invalid_argument("expected a plain number, found '" + std::string(text) + "'");
  return value;
}

double parse_bytes(std::string_view text) {
  const double v = parse_with(text, "a size such as '80 GiB' or '16 GB'", kByteUnits.data(),
                              kByteUnits.size(), kByteNames);
  return v;
}

double parse_time_s(std::string_view text) {
  return parse_with(text, "a time such as '5 us' or '1.5 ms'", kTimeUnits.data(), kTimeUnits.size(), kTimeNames);
}

double parse_bandwidth_bytes_per_s(std::string_view text) {
  constexpr std::string_view expected = "a bandwidth such as '25 GB/s' or '100 Gb/s'";
  auto [value, unit] = split_number(text, expected);
  refuse_bare(value, unit, text, expected, kBandwidthNames);
  if (unit.empty()) return value;
  std::string_view size_unit;
  if (unit.size() > 2 && unit.substr(unit.size() - 2) == "/s") {
    size_unit = unit.substr(0, unit.size() - 2);
  } else if (unit.size() > 2 && unit.substr(unit.size() - 2) == "ps") {
    size_unit = unit.substr(0, unit.size() - 2);  // "Gbps", "GBps"
  } else {
    for (const Unit& u : kByteUnits) {
      if (u.name == unit) {
        throw std::invalid_argument(std::string("expected ") + std::string(expected) +
                                    ", found '" + std::string(text) + "' (a size without '/s')");
      }
    }
    throw std::invalid_argument(std::string("expected ") + std::string(expected) +
                                ", found unknown unit '" + std::string(unit) + "'");
  }
  for (const Unit& u : kByteUnits) {
    if (u.name == size_unit) return finite_scaled(apply(value, u.factor), text);
  }
  throw std::invalid_argument(std::string("expected ") + std::string(expected) +
                              ", found unknown unit '" + std::string(unit) + "'");
}

double parse_price_usd_per_hour(std::string_view text) {
  constexpr std::string_view expected = "a price such as '2.1 USD/h'";
  auto [value, unit] = split_number(text, expected);
  if (unit.empty() || unit == "USD/h" || unit == "USD/hour") return value;
  throw std::invalid_argument(std::string("expected ") + std::string(expected) + ", found unknown unit '" +
                              std::string(unit) + "'");
}

double parse_flops_per_s(std::string_view text) {
  constexpr std::string_view expected = "a compute rate such as '312 TFLOP/s' or '19.5 TFLOPS'";
  auto [value, unit] = split_number(text, expected);
  refuse_bare(value, unit, text, expected, kFlopNames);
  if (unit.empty()) return value;
  for (const Unit& p : kFlopPrefixes) {
    for (std::string_view suffix : {"FLOP/s", "FLOPS", "flop/s", "flops"}) {
      if (unit.size() == p.name.size() + suffix.size() && unit.substr(0, p.name.size()) == p.name &&
          unit.substr(p.name.size()) == suffix) {
        return finite_scaled(value * p.factor, text);
      }
    }
  }
  throw std::invalid_argument(std::string("expected ") + std::string(expected) +
                              ", found unknown unit '" + std::string(unit) + "'");
}

std::string format_bytes(double bytes) {
  return format_with(bytes,
                     {{"PiB", kKi * kKi * kKi * kKi * kKi}, {"PB", 1e15}, {"TiB", kKi * kKi * kKi * kKi}, {"TB", 1e12},
                      {"GiB", kKi * kKi * kKi},
                      {"GB", 1e9}, {"MiB", kKi * kKi}, {"MB", 1e6}, {"KiB", kKi}, {"kB", 1e3}},
                     "B");
}

std::string format_time_s(double seconds) {
  return format_with(seconds, {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}}, "s");
}

std::string format_bandwidth(double bytes_per_s) {
  return format_with(bytes_per_s,
                     {{"TB/s", 1e12}, {"Tb/s", 1e12 / 8}, {"GB/s", 1e9}, {"Gb/s", 1e9 / 8},
                      {"MB/s", 1e6}, {"Mb/s", 1e6 / 8}, {"kB/s", 1e3}},
                     "B/s");
}

std::string format_flops_per_s(double flops_per_s) {
  return format_with(flops_per_s,
                     {{"PFLOP/s", 1e15}, {"TFLOP/s", 1e12}, {"GFLOP/s", 1e9}, {"MFLOP/s", 1e6}},
                     "FLOP/s");
}

std::string format_price_usd_per_hour(double usd_per_hour) { return shortest(usd_per_hour) + " USD/h"; }

std::string format_number(double value) { return shortest(value); }

std::string human_bytes(double bytes) {
  return human(bytes, {{"PiB", kKi * kKi * kKi * kKi * kKi}, {"TiB", kKi * kKi * kKi * kKi}, {"GiB", kKi * kKi * kKi},
                       {"MiB", kKi * kKi}, {"KiB", kKi}},
               "B");
}

std::string human_flops(double flops) {
  return human(flops, {{"EFLOP", 1e18}, {"PFLOP", 1e15}, {"TFLOP", 1e12}, {"GFLOP", 1e9},
                       {"MFLOP", 1e6}},
               "FLOP");
}

std::string human_bandwidth(double bytes_per_s) {
  return human(bytes_per_s, {{"TB/s", 1e12}, {"GB/s", 1e9}, {"MB/s", 1e6}, {"kB/s", 1e3}}, "B/s");
}

std::string human_count(double count) {
  return human(count, {{"T", 1e12}, {"B", 1e9}, {"M", 1e6}, {"K", 1e3}}, "");
}

std::string human_time_s(double seconds) {
  // From 1000 s on, three digits of seconds would print as "8.08e+03 s": minutes, hours and
  // days read at a glance.
  if (std::fabs(seconds) >= 1000) return human(seconds, {{"days", 86400}, {"h", 3600}, {"min", 60}}, "s");
  return human(seconds, {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}}, "s");
}

}  // namespace hetflow::model::units
