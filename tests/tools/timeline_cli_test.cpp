// hetflow timeline as a user runs it: a simulated trace drawn to SVG, rendered to PNG by an
// independent SVG renderer (rsvg-convert, from librsvg2-bin) at the size the SVG declares;
// bad input refused with exit 2 and the file named.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "tests/tools/run_hetflow.hpp"
#include "tools/cli.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;
using hetflow::test_support::slurp;
using hetflow::test_support::write_file;

namespace {

const char* kSimulate =
    "simulate --cluster cpu-4 --model gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256 --pipeline 4 --microbatches 4 "
    "--workspace 0 --iterations 2 --trace ";

std::string simulated_trace() {
  static const std::string path = [] {
    const std::string p = (scratch_dir() / "pipeline.csv").string();
    const auto r = run_hetflow(kSimulate + p);
    EXPECT_EQ(r.status, 0) << r.err;
    return p;
  }();
  return path;
}

int svg_size(const std::string& svg, const char* name) {
  std::smatch m;
  const std::string head = svg.substr(svg.find("<svg"), 300);
  EXPECT_TRUE(std::regex_search(head, m, std::regex(std::string(" ") + name + "=\"([0-9]+)\""))) << head;
  return m.empty() ? -1 : std::stoi(m[1]);
}

uint32_t big_endian(const std::string& bytes, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<unsigned char>(bytes[at + i]);
  return v;
}

// Renders the SVG with rsvg-convert and checks the PNG: the signature, and IHDR's width and
// height (bytes 16-23, big-endian) equal to the SVG's own.
void expect_renders(const std::string& svg_path) {
  ASSERT_EQ(std::system("command -v rsvg-convert >/dev/null 2>&1"), 0)
      << "rsvg-convert is missing: install librsvg2-bin (tools/install-deps.sh installs it)";
  const std::string png_path = svg_path + ".png", log = svg_path + ".log";
  ASSERT_EQ(std::system(("rsvg-convert -o " + png_path + " " + svg_path + " 2>" + log).c_str()), 0) << slurp(log);
  EXPECT_EQ(slurp(log), "");  // no complaint about the SVG
  const std::string png = slurp(png_path), svg = slurp(svg_path);
  ASSERT_GT(png.size(), 24u);
  EXPECT_EQ(png.substr(0, 8), "\x89PNG\r\n\x1a\n");
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  EXPECT_EQ(big_endian(png, 16), static_cast<uint32_t>(svg_size(svg, "width")));
  EXPECT_EQ(big_endian(png, 20), static_cast<uint32_t>(svg_size(svg, "height")));
}

TEST(TimelineCli, ASimulatedPipelineRendersToPng) {
  const std::string svg_path = (scratch_dir() / "timeline.svg").string();
  const auto r = run_hetflow("timeline " + simulated_trace() + " -o " + svg_path);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + svg_path), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of 4 devices, iterations 0-1 of 2"), std::string::npos) << r.out;
  const std::string svg = slurp(svg_path);
  EXPECT_NE(svg.find("forward: solid"), std::string::npos);
  // The title names the plan by the trace's fingerprint.
  const std::string csv = slurp(simulated_trace());
  const size_t at = csv.find("# fingerprint: ");
  ASSERT_NE(at, std::string::npos);
  const std::string fingerprint = csv.substr(at + 15, csv.find('\n', at) - at - 15);
  EXPECT_NE(svg.find("plan " + fingerprint), std::string::npos) << fingerprint;
  expect_renders(svg_path);
}

// The sizes the issue names: a 16-device interleaved schedule and 64 devices, simulated,
// drawn whole (sampling starts beyond 64 rows) and rendered.
TEST(TimelineCli, SixteenDeviceInterleavedAndSixtyFourDeviceTracesRender) {
  for (const auto& [cluster, layout, devices] :
       {std::tuple{"cpu-16", "--pipeline 4 --data 4 --virtual-stages 2 --schedule interleaved --microbatches 8", 16},
        std::tuple{"cpu-64", "--pipeline 4 --data 16 --microbatches 4", 64}}) {
    SCOPED_TRACE(cluster);
    const auto dir = scratch_dir();
    const std::string trace = (dir / "t.csv").string(), svg = (dir / "t.svg").string();
    const auto s = run_hetflow(std::string("simulate --cluster ") + cluster +
                               " --model gpt:layers=8,hidden=64,heads=4,seq=32,vocab=256 --workspace 0 --iterations 2 " +
                               layout + " --trace " + trace);
    ASSERT_EQ(s.status, 0) << s.err;
    const auto r = run_hetflow("timeline " + trace + " -o " + svg + " --json");
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["devices_drawn"], devices) << j;
    expect_renders(svg);
  }
}

TEST(TimelineCli, UtilizationRendersToPng) {
  const std::string svg_path = (scratch_dir() / "util.svg").string();
  const auto r = run_hetflow("timeline --utilization " + simulated_trace() + " -o " + svg_path + " --width 900 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["picture"], "utilization");
  EXPECT_EQ(j["devices_drawn"], 4);
  EXPECT_EQ(svg_size(slurp(svg_path), "width"), 900);
  EXPECT_NE(slurp(svg_path).find("compute "), std::string::npos);
  expect_renders(svg_path);
}

TEST(TimelineCli, IterationsPickWhatIsDrawn) {
  const std::string svg_path = (scratch_dir() / "one.svg").string();
  const auto r = run_hetflow("timeline " + simulated_trace() + " -o " + svg_path + " --iterations 1: --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["first_iteration"], 1);
  EXPECT_EQ(j["last_iteration"], 1);
  for (const char* bad : {"--iterations x", "--iterations 3:1", "--iterations 7:9", "--width 10"}) {
    const auto b = run_hetflow("timeline " + simulated_trace() + " -o " + svg_path + " " + bad);
    EXPECT_EQ(b.status, 2) << bad << ": " << b.err;
    EXPECT_NE(b.err.find("hetflow: <command line>: --"), std::string::npos) << bad << ": " << b.err;
  }
}

// The command line is checked as the command checks it, without reading the trace.
TEST(TimelineCli, ReadCommandLineChecksItsOptions) {
  std::ostringstream out;
  const auto line = hetflow::tools::read_command_line({"timeline", "no-such.csv", "-o", "x.svg", "--iterations", "2:"}, out);
  EXPECT_EQ(line.vm["trace"].as<std::string>(), "no-such.csv");
  for (const char* bad : {"x", "3:1", "-2"}) {
    EXPECT_THROW(hetflow::tools::read_command_line({"timeline", "t.csv", "-o", "x.svg", "--iterations", bad}, out),
                 hetflow::InputError)
        << bad;
  }
  EXPECT_THROW(hetflow::tools::read_command_line({"timeline", "t.csv", "-o", "x.svg", "--width", "50"}, out),
               hetflow::InputError);
}

TEST(TimelineCli, BadInputExits2NamingTheFile) {
  const std::string svg_path = (scratch_dir() / "bad.svg").string();
  const std::string missing = (scratch_dir() / "no-such-trace.csv").string();
  const std::string malformed = write_file("malformed.csv", "# hetflow trace v1\n# source: sim\nnot,a,header\n");
  const std::string bad_row = write_file(
      "bad_row.csv",
      "# hetflow trace v1\n# source: sim\n"
      "task,device,stream,kind,purpose,iteration,stage,microbatch,peer,group,start_s,end_s,bytes,flops\n"
      "0,0,compute,forward,compute,0,0,0,-1,-1,abc,1,0,0\n");
  const std::string empty = write_file(
      "empty.csv",
      "# hetflow trace v1\n# source: sim\n"
      "task,device,stream,kind,purpose,iteration,stage,microbatch,peer,group,start_s,end_s,bytes,flops\n");
  for (const auto& [file, words] : {std::pair{missing, "cannot be read"}, {malformed, "malformed.csv:3"},
                                    {bad_row, "bad_row.csv:4: start_s"}, {empty, "no events"},
                                    {scratch_dir().string(), "not a regular file"}}) {
    const auto r = run_hetflow("timeline " + file + " -o " + svg_path);
    EXPECT_EQ(r.status, 2) << file << ": " << r.err;
    EXPECT_NE(r.err.find("hetflow: " + file), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(words), std::string::npos) << r.err;
  }
  // No output file, or one that cannot be written.
  EXPECT_EQ(run_hetflow("timeline " + simulated_trace()).status, 2);
  const auto unwritable = run_hetflow("timeline " + simulated_trace() + " -o " + missing + "/x.svg");
  EXPECT_EQ(unwritable.status, 2);
  EXPECT_NE(unwritable.err.find("cannot be written"), std::string::npos) << unwritable.err;
}

}  // namespace
