#include "exec/training_checkpoint.hpp"

#include <filesystem>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "exec/atomic_file.hpp"
#include "exec/binary_io.hpp"
#include "model/error.hpp"
#include "model/json_util.hpp"

namespace hetflow::exec {

namespace fs = std::filesystem;
using model::json_util::brief;

namespace {

constexpr const char* kFormat = "hetflow-training-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kFiles[] = {"model.safetensors", "exp_avg.safetensors", "exp_avg_sq.safetensors"};
constexpr const char* kState = "trainer_state.json";

// The line on which `"key"` is first written, or 0.
int line_of(const std::string& text, const std::string& key) {
  const size_t at = text.find(nlohmann::json(key).dump());
  return at == std::string::npos ? 0 : model::json_util::line_at(text, at);
}

}  // namespace

std::string training_progress_json(const TrainingProgress& p) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["iterations"] = p.iterations;
  j["optimizer_steps"] = p.optimizer_steps;
  j["global_batch"] = p.global_batch;
  j["seq_len"] = p.seq_len;
  j["loss_scale"] = {{"dynamic", p.loss_scaler.dynamic},
                     {"scale", p.loss_scaler.scale},
                     {"growth_tracker", p.loss_scaler.growth_tracker},
                     {"hysteresis_tracker", p.loss_scaler.hysteresis_tracker}};
  j["model"] = p.model;
  return j.dump(2) + "\n";
}

TrainingProgress parse_training_progress(const std::string& text, const std::string& file) {
  const auto j = model::json_util::parse<nlohmann::ordered_json>(text, file);
  if (!j.is_object()) throw InputError(file, 1, "(top level)", "expected a JSON object, found " + brief(j));
  const auto member = [&](const nlohmann::ordered_json& in, const std::string& key,
                          const std::string& field) -> const nlohmann::ordered_json& {
    if (!in.contains(key)) throw InputError(file, 0, field, "is required in a training checkpoint's state");
    return in[key];
  };
  const auto integer = [&](const nlohmann::ordered_json& in, const std::string& key, const std::string& field,
                           long long least, long long most) {
    const auto& v = member(in, key, field);
    if (!v.is_number_integer() || v.get<long long>() < least || v.get<long long>() > most) {
      throw InputError(file, line_of(text, key), field,
                       "expected an integer in [" + std::to_string(least) + ", " + std::to_string(most) + "], found " +
                           brief(v));
    }
    return v.get<long long>();
  };
  const auto& format = member(j, "format", "format");
  if (!format.is_string() || format.get<std::string>() != kFormat) {
    throw InputError(file, line_of(text, "format"), "format", std::string("expected \"") + kFormat + "\", found " + brief(format));
  }
  const long long version = integer(j, "version", "version", 1, std::numeric_limits<int>::max());
  if (version != kVersion) {
    throw InputError(file, line_of(text, "version"), "version",
                     "is " + std::to_string(version) + "; this hetflow reads version " + std::to_string(kVersion));
  }
  constexpr long long kMost = std::numeric_limits<int>::max();
  TrainingProgress p;
  p.iterations = integer(j, "iterations", "iterations", 0, kMost);
  p.optimizer_steps = integer(j, "optimizer_steps", "optimizer_steps", 0, p.iterations);
  p.global_batch = static_cast<int>(integer(j, "global_batch", "global_batch", 1, kMost));
  p.seq_len = static_cast<int>(integer(j, "seq_len", "seq_len", 1, kMost));
  const auto& scale = member(j, "loss_scale", "loss_scale");
  if (!scale.is_object()) throw InputError(file, line_of(text, "loss_scale"), "loss_scale", "expected an object, found " + brief(scale));
  const auto& dynamic = member(scale, "dynamic", "loss_scale.dynamic");
  if (!dynamic.is_boolean()) {
    throw InputError(file, line_of(text, "dynamic"), "loss_scale.dynamic", "expected true or false, found " + brief(dynamic));
  }
  p.loss_scaler.dynamic = dynamic.get<bool>();
  const auto& s = member(scale, "scale", "loss_scale.scale");
  if (!s.is_number() || !(s.get<double>() >= kMinLossScale && s.get<double>() <= kMaxLossScale)) {
    throw InputError(file, line_of(text, "scale"), "loss_scale.scale", "expected a number in [2^-126, 2^126], found " + brief(s));
  }
  p.loss_scaler.scale = s.get<double>();
  p.loss_scaler.growth_tracker = static_cast<int>(integer(scale, "growth_tracker", "loss_scale.growth_tracker", 0, kMost));
  p.loss_scaler.hysteresis_tracker =
      static_cast<int>(integer(scale, "hysteresis_tracker", "loss_scale.hysteresis_tracker", -kMost, kMost));
  if (j.contains("model")) {
    if (!j["model"].is_string()) throw InputError(file, line_of(text, "model"), "model", "expected a string, found " + brief(j["model"]));
    p.model = j["model"].get<std::string>();
  }
  return p;
}

void write_training_checkpoint(const std::string& folder, const TrainingState& state) {
  const fs::path target = fs::path(folder).lexically_normal();
  const fs::path name = target.filename().empty() ? target.parent_path() : target;
  const fs::path partial = fs::path(name.string() + ".partial"), previous = fs::path(name.string() + ".previous");
  std::error_code error;
  const auto fail = [&](const fs::path& path, const std::string& what) {
    throw InputError(path.string(), 0, "file", what + (error ? ": " + error.message() : std::string()));
  };
  fs::remove_all(partial, error);
  if (error) fail(partial, "cannot be removed");
  if (!fs::create_directory(partial, error) || error) fail(partial, "cannot be created");
  const SafetensorsFile* files[] = {&state.weights, &state.exp_avg, &state.exp_avg_sq};
  for (size_t k = 0; k < 3; ++k) write_safetensors((partial / kFiles[k]).string(), *files[k]);
  const std::string json = training_progress_json(state.progress);
  AtomicFile out((partial / kState).string());
  out.write(json.data(), json.size());
  out.commit();
  // The folder's place: the old checkpoint moves aside, the new one in, the old one goes.
  const bool had = fs::exists(name, error);
  if (had) {
    if (!fs::is_directory(name, error)) fail(name, "exists and is not a folder");
    fs::remove_all(previous, error);
    fs::rename(name, previous, error);
    if (error) fail(name, "cannot be moved aside");
  }
  fs::rename(partial, name, error);
  if (error) fail(name, "cannot be written");
  if (had) fs::remove_all(previous, error);  // (left behind, it is only a stale copy)
}

namespace {

// The folder, once it is known to hold a training checkpoint's state.
std::string checked_folder(const std::string& folder) {
  std::error_code error;
  if (!fs::is_directory(folder, error)) {
    throw InputError(folder, 0, "file", "is not a folder (a training checkpoint is one, as --save-checkpoint writes it)");
  }
  if (!fs::is_regular_file(fs::path(folder) / kState, error)) {
    throw InputError(folder, 0, "file",
                     std::string("holds no ") + kState + ": not a training checkpoint (--init-weights starts from weights alone)");
  }
  return folder;
}

std::string read_state(const std::string& path) {
  const ReadOnlyFile in(path);  // refuses what is not a regular file (a FIFO would block)
  constexpr std::uint64_t kMostBytes = 1 << 20;  // the state is a few hundred bytes
  if (in.size_bytes() > kMostBytes) throw InputError(path, 0, "file", "is larger than 1 MiB: not a training state");
  std::string text(static_cast<size_t>(in.size_bytes()), '\0');
  in.read(0, text.size(), text.data());
  return text;
}

}  // namespace

TrainingCheckpoint::TrainingCheckpoint(const std::string& folder)
    : folder_(checked_folder(folder)),
      weights_((fs::path(folder_) / kFiles[0]).string()),
      exp_avg_((fs::path(folder_) / kFiles[1]).string()),
      exp_avg_sq_((fs::path(folder_) / kFiles[2]).string()) {
  const std::string state = (fs::path(folder_) / kState).string();
  progress_ = parse_training_progress(read_state(state), state);
  // The moments are of the weights: the same tensors, each of the same shape.
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const TensorInfo& t : weights_.tensors()) shapes[t.name] = t.shape;
  for (const Checkpoint* moments : {&exp_avg_, &exp_avg_sq_}) {
    if (moments->tensors().size() != shapes.size()) {
      throw InputError(moments->path(), 0, "file",
                       "holds " + std::to_string(moments->tensors().size()) + " tensors and " + weights_.path() + " " +
                           std::to_string(shapes.size()) + ": a moment for every weight, no more");
    }
    for (const TensorInfo& t : moments->tensors()) {
      const auto found = shapes.find(t.name);
      if (found == shapes.end()) throw InputError(moments->path(), 0, t.name, "is not a tensor of " + weights_.path());
      if (found->second != t.shape) throw InputError(moments->path(), 0, t.name, "has another shape than in " + weights_.path());
    }
  }
}

}  // namespace hetflow::exec
