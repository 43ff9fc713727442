#pragma once
// Quantities with units, as users write them in cluster and model files: "25 GB/s", "100 Gb/s",
// "5 us", "80 GiB", "312 TFLOP/s", "2.1 USD/h". Parsing returns SI base units (bytes, seconds, bytes/s,
// FLOP/s). A size, time, bandwidth or compute rate needs its unit: a plain number other than
// 0 is refused, naming the units accepted (a bare "25" meant as 25 Gb/s would otherwise be read
// as 25 bytes/s). A price's plain number is USD/h. Decimal prefixes are powers of
// 1000, binary ones (KiB, MiB, GiB, TiB, PiB) powers of 1024; a lower-case 'b' means bits.
// Parse failures throw std::invalid_argument whose message says what was expected; callers
// that know the file and line wrap it into an InputError.
#include <string>
#include <string_view>

namespace hetflow::model::units {

double parse_number(std::string_view text);  // a finite number and nothing after it
double parse_bytes(std::string_view text);
double parse_time_s(std::string_view text);
double parse_bandwidth_bytes_per_s(std::string_view text);
double parse_flops_per_s(std::string_view text);
// A rental price per GPU and hour: "2.1 USD/h" (also "USD/hour"); a plain number is USD/h.
double parse_price_usd_per_hour(std::string_view text);

// Formatting picks the largest unit that still reads back to exactly the same double,
// so format -> parse is lossless ("25 GB/s", "7 GB/s", "2 us", "80 GiB").
std::string format_bytes(double bytes);
std::string format_time_s(double seconds);
std::string format_bandwidth(double bytes_per_s);
std::string format_flops_per_s(double flops_per_s);
std::string format_price_usd_per_hour(double usd_per_hour);  // "2.1 USD/h"

// Shortest decimal text of a number that reads back to exactly the same double.
std::string format_number(double value);

// Short, human-rounded forms for tables (3 significant digits): "1.23 TB", "312 TFLOP/s".
std::string human_bytes(double bytes);
std::string human_flops(double flops);
std::string human_bandwidth(double bytes_per_s);  // decimal: "900 GB/s"
std::string human_count(double count);  // 1.75e11 -> "175B"
std::string human_time_s(double seconds);  // "24.7 s", "951 ms"; from 1000 s "16.7 min", "2.24 h", "426 days"

}  // namespace hetflow::model::units
