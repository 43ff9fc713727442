#include "exec/checkpoint.hpp"

#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "exec/binary_io.hpp"
#include "model/error.hpp"
#include "model/json_util.hpp"

namespace hetflow::exec {

namespace fs = std::filesystem;
using model::json_util::brief;

namespace {

// The line of the index on which `key` is written (as a JSON string), or 0 when it cannot be
// found as written (an escaped name).
int line_of(const std::string& text, const std::string& key) {
  const size_t at = text.find(nlohmann::json(key).dump());
  return at == std::string::npos ? 0 : model::json_util::line_at(text, at);
}

}  // namespace

SafetensorsIndex parse_safetensors_index(const std::string& text, const std::string& file) {
  const auto j = model::json_util::parse<nlohmann::ordered_json>(text, file);
  if (!j.is_object()) throw InputError(file, 1, "(top level)", "expected a JSON object, found " + brief(j));
  if (!j.contains("weight_map")) throw InputError(file, 0, "weight_map", "is required in a safetensors index");
  const auto& map = j["weight_map"];
  const int map_line = line_of(text, "weight_map");
  if (!map.is_object() || map.empty()) {
    throw InputError(file, map_line, "weight_map", "expected an object of tensor names and their shard files, found " +
                                                       (map.is_object() ? std::string("an empty one") : brief(map)));
  }
  if (j.contains("metadata") && !j["metadata"].is_object()) {
    throw InputError(file, line_of(text, "metadata"), "metadata", "expected an object, found " + brief(j["metadata"]));
  }
  const std::string self = fs::path(file).filename().string();
  SafetensorsIndex index;
  std::set<std::string> seen;
  for (const auto& [tensor, shard] : map.items()) {
    const std::string field = "weight_map." + tensor;
    // (Found only for an error: a search per entry would make a large index quadratic.)
    const auto line = [&text, &tensor] { return line_of(text, tensor); };
    if (tensor.empty()) throw InputError(file, map_line, "weight_map", "a tensor name is empty");
    if (!shard.is_string()) throw InputError(file, line(), field, "expected a shard file name, found " + brief(shard));
    const std::string name = shard.get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find_first_of(std::string("/\\\0", 3)) != std::string::npos) {
      throw InputError(file, line(), field, "expected the name of a file beside the index, found " + brief(shard));
    }
    if (name == self) throw InputError(file, line(), field, "names the index itself as the shard holding it");
    if (seen.insert(name).second) index.shards.push_back(name);
    index.weight_map.emplace_back(tensor, name);
  }
  return index;
}

InMemoryWeights::InMemoryWeights(const SafetensorsFile& file, std::string path) : file_(file), path_(std::move(path)) {
  for (const NamedTensor& t : file.tensors) tensors_.push_back({t.name, t.shape});
}

namespace {

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string resolve(const std::string& path) {
  std::error_code error;
  if (!fs::is_directory(path, error)) return path;
  for (const char* name : {"model.safetensors", "model.safetensors.index.json"}) {  // transformers' order
    const fs::path candidate = fs::path(path) / name;
    if (fs::is_regular_file(candidate, error)) return candidate.string();
  }
  throw InputError(path, 0, "file", "is a directory holding neither model.safetensors nor model.safetensors.index.json");
}

}  // namespace

Checkpoint::Checkpoint(const std::string& path) : path_(resolve(path)) {
  if (!ends_with(path_, ".json")) {
    files_.emplace_back(path_);
    for (size_t i = 0; i < files_[0].tensors().size(); ++i) {
      tensors_.push_back(files_[0].tensors()[i]);
      where_.emplace_back(0, i);
    }
    return;
  }
  std::string text;
  {
    const ReadOnlyFile in(path_);  // refuses what is not a regular file (a FIFO would block)
    if (in.size_bytes() > kMaxSafetensorsHeaderBytes) {
      throw InputError(path_, 0, "file", std::to_string(in.size_bytes()) + " bytes: more than the 100 MiB an index may have");
    }
    text.resize(static_cast<size_t>(in.size_bytes()));
    in.read(0, text.size(), text.data());
  }
  const SafetensorsIndex index = parse_safetensors_index(text, path_);
  const std::map<std::string, std::string> shard_of(index.weight_map.begin(), index.weight_map.end());
  const fs::path folder = fs::path(path_).parent_path();
  std::set<std::string> found;
  for (const std::string& shard : index.shards) {
    const std::string file = (folder / shard).string();
    std::error_code error;  // (a name too long, a loop of links: not a file either)
    if (!fs::is_regular_file(file, error)) {
      throw InputError(path_, line_of(text, shard), "weight_map",
                       "names the shard '" + shard + "', which is not a file beside it");
    }
    files_.emplace_back(file);
    const std::vector<TensorInfo>& held = files_.back().tensors();
    for (size_t i = 0; i < held.size(); ++i) {
      const std::string& name = held[i].name;
      const auto listed = shard_of.find(name);
      if (listed == shard_of.end()) {
        throw InputError(file, 0, "header." + name, "is a tensor of this shard that the index " + path_ + " does not name");
      }
      if (listed->second != shard) {
        throw InputError(path_, line_of(text, name), "weight_map." + name,
                         "places it in " + listed->second + ", but it is in " + shard +
                             (found.count(name) != 0 ? " (and in another shard before it)" : ""));
      }
      found.insert(name);
      tensors_.push_back(held[i]);
      where_.emplace_back(files_.size() - 1, i);
    }
  }
  for (const auto& [tensor, shard] : index.weight_map) {
    if (found.count(tensor) == 0) {
      throw InputError(path_, line_of(text, tensor), "weight_map." + tensor, "names a tensor that " + shard + " does not hold");
    }
  }
}

std::vector<float> Checkpoint::read(size_t index) const {
  const auto [file, at] = where_.at(index);
  return files_[file].read(at);
}

SafetensorsFile read_checkpoint(const std::string& path) {
  const Checkpoint checkpoint(path);
  SafetensorsFile all;
  for (size_t i = 0; i < checkpoint.tensors().size(); ++i) {
    all.tensors.push_back({checkpoint.tensors()[i].name, checkpoint.tensors()[i].shape, checkpoint.read(i)});
  }
  return all;
}

}  // namespace hetflow::exec
