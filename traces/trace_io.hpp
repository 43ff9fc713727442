#pragma once
// Traces on disk. CSV is the lossless format that replay and calibration read back; Chrome
// trace-event JSON is for looking at a run in Perfetto (ui.perfetto.dev) or chrome://tracing.
// Writers keep the trace's event order (call sort_events first for canonical files) and are
// deterministic: the same trace gives the same bytes.
#include <string>

#include "traces/trace.hpp"

namespace hetflow::traces {

// CSV, version 2 (version 1, without the last column, reads with message -1):
//   # hetflow trace v2
//   # source: sim
//   # plan: gpt-1.3b on 4xA100
//   # fingerprint: xxh3:0123456789abcdef   (the plan's; absent when unknown)
//   # compute: proxy                        (executors: how compute ran; absent for the simulator)
//   # device 0 A100-80GB              (one line per device, ids 0, 1, ... in order)
//   task,device,stream,kind,purpose,iteration,stage,microbatch,peer,group,start_s,end_s,bytes,flops,message
//   0,0,compute,forward,compute,0,0,0,-1,-1,0,0.0125,0,1.5e+12,-1
//   0,0,compute,collective,tensor_parallel,0,0,0,-1,4,0.003,0.004,2097152,0,0   (an in-task message)
// Numbers are written in the shortest form that reads back to exactly the same double, so
// read_trace_csv(write_trace_csv(t)) == t. A text field (or header value) holding a comma,
// a quote or a line break is quoted CSV-style ("a ""b"", c"); the reader undoes it.
std::string write_trace_csv(const Trace& trace);

// Reads what write_trace_csv writes (also with CRLF line ends). Throws InputError(file, line,
// column, message) on anything else, e.g. "trace.csv:7: start_s: expected a number, found
// 'abc'": wrong header or column count, a bad integer or number, a non-finite time, negative
// bytes/flops, end_s < start_s, task or device < 0, a device or peer outside the device list
// (when the file has one; else from model::limits::kMaxGpus on). Never throws anything else,
// whatever the input. It checks the format only: kind and purpose strings are taken as they are.
Trace read_trace_csv(const std::string& text, const std::string& file);

// The pieces of the CSV writers (traces and metrics): the shortest text that reads back to
// exactly the same double; a text field, quoted CSV-style when it holds a comma, a quote or
// a line break.
std::string format_double(double v);
std::string csv_field(const std::string& s);

// Chrome trace-event JSON: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}.
//  - one process per device (pid = device + 1, since viewers treat pid 0 specially) named by a
//    process_name event; one thread per (device, stream), tids 1, 2, ... in order of first
//    appearance, named by a thread_name event;
//  - one complete event ("ph": "X") per trace event, ts and dur in microseconds, cat = kind,
//    name "F3", "B3", "W3" (".<stage>" appended on devices that hold several stages),
//    "optimizer", "send 2 MiB", "recv 2 MiB", "<purpose> 61 MiB" for a collective; args carry task,
//    iteration, stage, microbatch, purpose, bytes, flops (and peer, group for transfers);
//  - a flow arrow per matched send/recv pair (same group): "s" at the send slice's start,
//    "f" with "bp": "e" inside the recv slice, both with id = group.
// Events are expected to have device >= 0.
std::string write_chrome_trace(const Trace& trace);

}  // namespace hetflow::traces
