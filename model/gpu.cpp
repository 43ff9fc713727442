#include "model/gpu.hpp"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace hetflow::model {

std::string_view to_string(LinkKind k) {
  switch (k) {
    case LinkKind::pcie: return "pcie";
    case LinkKind::nvlink: return "nvlink";
    case LinkKind::nvswitch: return "nvswitch";
  }
  return "pcie";
}

LinkKind parse_link_kind(std::string_view text) {
  if (text == "pcie") return LinkKind::pcie;
  if (text == "nvlink") return LinkKind::nvlink;
  if (text == "nvswitch") return LinkKind::nvswitch;
  throw std::invalid_argument("expected one of pcie, nvlink, nvswitch, found '" + std::string(text) + "'");
}

double GpuSpec::peak_flops_per_s(Precision p) const {
  switch (p) {
    case Precision::fp32: return fp32_flops_per_s;
    case Precision::fp16: return fp16_flops_per_s;
    case Precision::bf16: return bf16_flops_per_s > 0 ? bf16_flops_per_s : fp32_flops_per_s;
  }
  return fp32_flops_per_s;
}

namespace {
std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}
// The same, a swap of two neighbours counting as one edit ("gpsu" for "gpus"): the optimal
// string alignment distance.
size_t typo_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}
}  // namespace

const GpuSpec* find_builtin_gpu(std::string_view name) {
  const std::string key = lower(name);
  for (const GpuSpec& g : builtin_gpus()) {
    if (lower(g.name) == key) return &g;
  }
  return nullptr;
}

std::optional<std::string> likely_misspelling(std::string_view name, const std::vector<std::string>& known) {
  const std::string key = lower(name);
  const size_t allowed = std::clamp<size_t>(key.size() / 3, 1, 3);
  size_t best = allowed + 1;
  std::optional<std::string> out;
  for (const std::string& k : known) {
    const size_t d = typo_distance(key, lower(k));
    if (d != 0 && d < best) {
      best = d;
      out = k;
    }
  }
  return out;
}

std::vector<std::string> nearest_names(std::string_view name, const std::vector<std::string>& known,
                                       size_t count) {
  const std::string key = lower(name);
  std::vector<std::pair<size_t, std::string>> scored;
  for (const std::string& k : known) {
    const std::string lk = lower(k);
    // A prefix match ("v100" for "V100-32") is as good as one edit.
    size_t d = edit_distance(key, lk);
    if (!key.empty() && lk.rfind(key, 0) == 0) d = std::min<size_t>(d, 1);
    scored.emplace_back(d, k);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (const auto& [d, k] : scored) {
    if (out.size() == count) break;
    out.push_back(k);
  }
  return out;
}

}  // namespace hetflow::model
