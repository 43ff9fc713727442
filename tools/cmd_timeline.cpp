// hetflow timeline: draw a trace (CSV) as an SVG picture, the pipeline schedule per device
// (traces/timeline_svg.hpp), or with --utilization each device's busy / communicating / idle
// shares.
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

#include "model/error.hpp"
#include "model/units.hpp"
#include "tools/cli.hpp"
#include "tools/trace_files.hpp"
#include "traces/timeline_svg.hpp"
#include "traces/trace_io.hpp"

namespace hetflow::tools {

namespace {

int parse_iteration(const std::string& text, const std::string& whole) {
  size_t used = 0;
  int value = -1;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value < 0) {
    throw InputError("<command line>", 0, "--iterations",
                     "expected A:B, A:, :B or A with iteration numbers >= 0, found '" + whole + "'");
  }
  return value;
}

// "A:B" (inclusive), "A:" (A to the last), ":B" (0 to B), "A" (only A).
traces::IterationRange parse_iterations(const std::string& text) {
  traces::IterationRange r;
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    r.first = r.last = parse_iteration(text, text);
    return r;
  }
  const std::string a = text.substr(0, colon), b = text.substr(colon + 1);
  if (a.empty() && b.empty()) return r;
  r.first = a.empty() ? 0 : parse_iteration(a, text);
  r.last = b.empty() ? -1 : parse_iteration(b, text);
  if (r.last >= 0 && r.last < r.first) {
    throw InputError("<command line>", 0, "--iterations", "the first iteration comes after the last in '" + text + "'");
  }
  return r;
}

traces::TimelineOptions read_timeline_options(const po::variables_map& vm) {
  traces::TimelineOptions o;
  o.width_px = vm["width"].as<int>();
  if (o.width_px < 400 || o.width_px > 20000) {
    throw InputError("<command line>", 0, "--width", "expected 400 to 20000 pixels, found " + std::to_string(o.width_px));
  }
  if (vm.count("iterations")) o.iterations = parse_iterations(vm["iterations"].as<std::string>());
  return o;
}

}  // namespace

void check_timeline_options(const po::variables_map& vm) { (void)read_timeline_options(vm); }

void timeline_options(po::options_description& options) {
  options.add_options()
      ("trace", po::value<std::string>()->required(), "the trace to draw (CSV, as simulate --trace and run --trace write it)")
      ("out,o", po::value<std::string>()->required(), "write the SVG picture here")
      ("utilization", po::bool_switch(), "draw each device's busy / communicating / idle shares instead of the timeline")
      ("iterations", po::value<std::string>(),
       "A:B draws iterations A to B (inclusive), A: from A on, :B up to B, A only A (default: all, or the "
       "first ones that fit 40000 events)")
      ("width", po::value<int>()->default_value(1400), "picture width in pixels (400 to 20000)");
}

int run_timeline(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("timeline options");
  po::variables_map vm;
  if (!parse_command_options("timeline", args, options, vm, out)) return 0;
  const traces::TimelineOptions o = read_timeline_options(vm);
  const std::string path = vm["trace"].as<std::string>(), svg_path = vm["out"].as<std::string>();
  const bool utilization = vm["utilization"].as<bool>();

  traces::Trace trace;
  try {
    trace = read_trace_file(path);
  } catch (const InputError& e) {
    if (e.field() != "events") throw;
    throw InputError(path, 0, "events", "the trace has no events; there is nothing to draw");
  }
  traces::TimelineView view;
  std::string svg;
  try {
    view = traces::timeline_view(trace, o);
    svg = utilization ? traces::utilization_svg(trace, o) : traces::timeline_svg(trace, o);
  } catch (const InputError& e) {  // the library says "<trace>"; the user gave a file
    throw InputError(e.field() == "iterations" ? "<command line>" : path, 0,
                     e.field() == "iterations" ? "--iterations" : e.field(), e.message() + " (" + path + ")");
  }
  std::ofstream file(svg_path, std::ios::binary);
  if (!(file << svg) || !file.flush()) throw InputError(svg_path, 0, "--out", "cannot be written");

  if (vm.count("json")) {
    print_json(out, Json{{"wrote", svg_path},
                         {"picture", utilization ? "utilization" : "timeline"},
                         {"first_iteration", view.first_iteration},
                         {"last_iteration", view.last_iteration},
                         {"devices_drawn", view.devices.size()},
                         {"devices", view.trace_devices},
                         {"sampled", view.sampled},
                         {"events_drawn", view.events},
                         {"span_s", view.end_s - view.start_s},
                         {"partial", trace.partial}});
    return 0;
  }
  out << "wrote " << svg_path << " (" << (utilization ? "utilization of " : "timeline of ") << view.devices.size()
      << (view.sampled ? " sampled" : "") << " of " << view.trace_devices << " devices, "
      << (view.first_iteration == view.last_iteration
              ? "iteration " + std::to_string(view.first_iteration)
              : "iterations " + std::to_string(view.first_iteration) + "-" + std::to_string(view.last_iteration))
      << " of " << view.trace_last_iteration - view.trace_first_iteration + 1LL << ", "
      << view.events << " events, " << model::units::human_time_s(view.end_s - view.start_s) << ")\n";
  if (!trace.partial.empty()) out << "  a partial trace (" << trace.partial << "): what completed is drawn\n";
  return 0;
}

}  // namespace hetflow::tools
