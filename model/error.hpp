#pragma once
// The one error policy of hetflow: library code throws these; only tools/ turns them into
// messages and exit codes. InputError carries where the bad input came from.
#include <cstddef>
#include <stdexcept>
#include <string>

namespace hetflow {

// Base of every error hetflow throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Input that cannot be used (a file, an option, a spec string). what() reads
// "file:line: field: message"; line 0 means "no line" and is left out.
class InputError : public Error {
 public:
  InputError(std::string file, int line, std::string field, std::string message);
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  const std::string& field() const { return field_; }
  const std::string& message() const { return message_; }

 private:
  std::string file_;
  int line_;
  std::string field_;
  std::string message_;
};

// JSON the parser refused, as "file:line: json: not valid JSON at column C: <reason>" when
// it says where (`byte`: 1-based position in `text`, 0 when it does not say; a number too
// large for a double has no position). `library_message` is the parser's what(); its own
// prefix ("[json.exception.parse_error.101] parse error at line 3, column 5: ") is dropped.
InputError json_syntax_error(const std::string& text, const std::string& file, size_t byte,
                             const std::string& library_message);

// A plan that cannot run: deadlock, unmatched transfer, memory overflow.
class PlanError : public Error {
 public:
  using Error::Error;
};

}  // namespace hetflow
