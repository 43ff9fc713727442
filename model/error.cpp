#include "model/error.hpp"

namespace hetflow {

namespace {
std::string format_input_error(const std::string& file, int line, const std::string& field,
                               const std::string& message) {
  std::string out = file.empty() ? std::string("<input>") : file;
  if (line > 0) out += ":" + std::to_string(line);
  out += ": ";
  if (!field.empty()) out += field + ": ";
  out += message;
  return out;
}
}  // namespace

InputError::InputError(std::string file, int line, std::string field, std::string message)
    : Error(format_input_error(file, line, field, message)),
      file_(std::move(file)),
      line_(line),
      field_(std::move(field)),
      message_(std::move(message)) {}

InputError json_syntax_error(const std::string& text, const std::string& file, size_t byte,
                             const std::string& library_message) {
  std::string reason = library_message;
  if (reason.rfind("[json.exception.", 0) == 0 && reason.find("] ") != std::string::npos) {
    reason.erase(0, reason.find("] ") + 2);
  }
  if (reason.rfind("parse error", 0) == 0 && reason.find(": ") != std::string::npos) {
    reason.erase(0, reason.find(": ") + 2);
  }
  if (byte == 0) return InputError(file, 0, "json", "not valid JSON: " + reason);
  int line = 1;
  size_t column = 0;
  for (size_t i = 0; i < byte && i < text.size(); ++i) {
    ++column;
    if (text[i] == '\n') {
      ++line;
      column = 0;
    }
  }
  return InputError(file, line, "json", "not valid JSON at column " + std::to_string(column) + ": " + reason);
}

}  // namespace hetflow
