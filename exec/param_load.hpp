#pragma once
// A rank's share of a parameter read from weights with HuggingFace names (a safetensors
// file, a checkpoint on disk: exec/checkpoint.hpp's WeightSource). Errors are InputError
// naming the source and the parameter.
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "exec/checkpoint.hpp"
#include "exec/decoder_params.hpp"

namespace hetflow::exec {

// The names a parameter may have in a HuggingFace file (GPT-2's checkpoints name the base
// model's tensors without "transformer.").
std::vector<std::string> hf_file_names(const std::string& name);
// Each tensor's index in `source`, by name.
std::map<std::string, size_t> tensor_index(const WeightSource& source);
// The index of the tensor holding the parameter `slot_name` (under any of its file names)
// in tensor_index's map, or size_t(-1).
size_t find_param_tensor(const std::map<std::string, size_t>& by_name, const std::string& slot_name);
// InputError when the source's tensor `index` has another shape than the parameter.
void check_param_shape(const ParamSlot& slot, const WeightSource& source, size_t index);
// This rank's share of the parameter from the source's tensor `index`, read now.
void load_param(const ParamSlot& slot, const WeightSource& source, size_t index, float* out);

}  // namespace hetflow::exec
