// Fuzz target: the trace reader (traces::read_trace_csv). An accepted trace is written back
// as CSV, which must read back equal (the format is lossless), and as a Chrome trace.
#include "tests/fuzz/fuzz_check.hpp"
#include "traces/trace_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string text = fuzz::text_of(data, size);
  const std::string file = "trace.csv";
  traces::Trace trace;
  try {
    trace = traces::read_trace_csv(text, file);
  } catch (const InputError& e) {
    fuzz::check_refusal(e, file, text);
    return 0;
  }
  FUZZ_CHECK(traces::read_trace_csv(traces::write_trace_csv(trace), "written.csv") == trace);
  FUZZ_CHECK(!traces::write_chrome_trace(trace).empty());
  return 0;
}
