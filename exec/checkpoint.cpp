#include "exec/checkpoint.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/json_util.hpp"

namespace hetflow::exec {

namespace fs = std::filesystem;
using model::json_util::brief;

SafetensorsIndex parse_safetensors_index(const std::string& text, const std::string& file) {
  const auto j = model::json_util::parse<nlohmann::ordered_json>(text, file);
  if (!j.is_object()) throw InputError(file, 1, "(top level)", "expected a JSON object, found " + brief(j));
  if (!j.contains("weight_map")) throw InputError(file, 1, "weight_map", "is required in a safetensors index");
  const auto& map = j["weight_map"];
  if (!map.is_object() || map.empty()) {
    throw InputError(file, 1, "weight_map", "expected an object of tensor names and their shard files, found " +
                                                (map.is_object() ? std::string("an empty one") : brief(map)));
  }
  if (j.contains("metadata") && !j["metadata"].is_object()) {
    throw InputError(file, 1, "metadata", "expected an object, found " + brief(j["metadata"]));
  }
  SafetensorsIndex index;
  std::set<std::string> seen;
  for (const auto& [tensor, shard] : map.items()) {
    const std::string field = "weight_map." + tensor;
    if (tensor.empty()) throw InputError(file, 1, "weight_map", "a tensor name is empty");
    if (!shard.is_string()) throw InputError(file, 1, field, "expected a shard file name, found " + brief(shard));
    const std::string name = shard.get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\\') != std::string::npos) {
      throw InputError(file, 1, field, "expected the name of a file beside the index, found '" + name + "'");
    }
    if (seen.insert(name).second) index.shards.push_back(name);
    index.weight_map.emplace_back(tensor, name);
  }
  return index;
}

namespace {

SafetensorsFile read_sharded(const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) throw InputError(index_path, 0, "file", "cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  const SafetensorsIndex index = parse_safetensors_index(text.str(), index_path);
  std::map<std::string, std::string> shard_of(index.weight_map.begin(), index.weight_map.end());
  const fs::path folder = fs::path(index_path).parent_path();
  SafetensorsFile all;
  std::set<std::string> found;
  for (const std::string& shard : index.shards) {
    const std::string path = (folder / shard).string();
    if (!fs::is_regular_file(path)) {
      throw InputError(index_path, 0, "weight_map", "names the shard '" + shard + "', which is not a file beside it");
    }
    SafetensorsFile part = read_safetensors(path);
    for (NamedTensor& t : part.tensors) {
      const auto listed = shard_of.find(t.name);
      if (listed == shard_of.end()) {
        throw InputError(path, 0, "header." + t.name, "is a tensor of this shard that the index " + index_path +
                                                         " does not name");
      }
      if (listed->second != shard) {
        throw InputError(index_path, 0, "weight_map." + t.name,
                         "places it in " + listed->second + ", but it is in " + shard +
                             (found.count(t.name) != 0 ? " (and in another shard before it)" : ""));
      }
      found.insert(t.name);
      all.tensors.push_back(std::move(t));
    }
    for (auto& [key, value] : part.metadata) all.metadata.emplace(key, std::move(value));
  }
  for (const auto& [tensor, shard] : index.weight_map) {
    if (found.count(tensor) == 0) {
      throw InputError(index_path, 0, "weight_map." + tensor, "names a tensor that " + shard + " does not hold");
    }
  }
  return all;
}

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

SafetensorsFile read_checkpoint(const std::string& path) {
  std::error_code error;
  if (fs::is_directory(path, error)) {
    for (const char* name : {"model.safetensors.index.json", "model.safetensors"}) {
      const fs::path candidate = fs::path(path) / name;
      if (fs::is_regular_file(candidate, error)) return read_checkpoint(candidate.string());
    }
    throw InputError(path, 0, "file", "is a directory holding neither model.safetensors.index.json nor model.safetensors");
  }
  if (ends_with(path, ".json")) return read_sharded(path);
  return read_safetensors(path);
}

}  // namespace hetflow::exec
