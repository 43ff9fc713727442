// Fuzz target: the trace reader (traces::read_trace_csv). An accepted trace is written back
// as CSV, which must read back equal (the format is lossless), as a Chrome trace, and as the
// SVG pictures (refused only when it has no events).
#include "tests/fuzz/fuzz_check.hpp"
#include "traces/timeline_svg.hpp"
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
  try {
    FUZZ_CHECK(traces::timeline_svg(trace).find("</svg>") != std::string::npos);
    FUZZ_CHECK(traces::utilization_svg(trace).find("</svg>") != std::string::npos);
  } catch (const InputError& e) {
    FUZZ_CHECK(e.field() == "events" && trace.events.empty());
  }
  return 0;
}
