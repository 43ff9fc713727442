#include "exec/param_load.hpp"

#include <algorithm>

#include "model/error.hpp"

namespace hetflow::exec {

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

// HuggingFace's GPT-2 checkpoints name the base model's tensors without "transformer.";
// these are the names a parameter may have in a file.
std::vector<std::string> hf_file_names(const std::string& name) {
  std::vector<std::string> names{name};
  const std::string prefix = "transformer.";
  if (name.rfind(prefix, 0) == 0) names.push_back(name.substr(prefix.size()));
  return names;
}

void check_param_shape(const ParamSlot& slot, const WeightSource& source, size_t index) {
  const TensorInfo& t = source.tensors()[index];
  if (t.shape != slot.shape) {
    throw InputError(source.path(), 0, slot.name,
                     "expected shape " + shape_text(slot.shape) + ", found " + shape_text(t.shape));
  }
}

// This rank's share of a parameter from the source's tensor `index` (read now).
void load_param(const ParamSlot& slot, const WeightSource& source, size_t index, float* out) {
  check_param_shape(slot, source, index);
  const std::vector<float> data = source.read(index);
  const std::vector<float> shard = shard_of(slot, data.data());
  std::copy(shard.begin(), shard.end(), out);
}

// The index in `source` of the tensor holding `slot` (under any of its file names), or npos.
size_t find_param_tensor(const std::map<std::string, size_t>& by_name, const std::string& slot_name) {
  for (const std::string& name : hf_file_names(slot_name)) {
    if (auto i = by_name.find(name); i != by_name.end()) return i->second;
  }
  return static_cast<size_t>(-1);
}

std::map<std::string, size_t> tensor_index(const WeightSource& source) {
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < source.tensors().size(); ++i) by_name[source.tensors()[i].name] = i;
  return by_name;
}

}  // namespace hetflow::exec
