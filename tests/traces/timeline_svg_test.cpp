// The SVG pictures of a trace, checked by reading the SVG back: it is well-formed (tags
// balance, attributes quoted), every drawn event has one box on its device's row, boxes stay
// in the drawing area and follow start times left to right; many devices are sampled and the
// picture says so; names are escaped.
#include "traces/timeline_svg.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "model/error.hpp"

namespace hetflow::traces {
namespace {

Event event(int task, int device, std::string stream, std::string kind, int microbatch, double start_s, double end_s,
            int iteration = 0) {
  Event e;
  e.task = task, e.device = device, e.stream = std::move(stream), e.kind = partition::parse_task_kind(kind);
  e.purpose = kind == "send" || kind == "recv" ? partition::Purpose::activation : partition::Purpose::compute;
  e.microbatch = microbatch, e.stage = device, e.iteration = iteration;
  e.start_s = start_s, e.end_s = end_s;
  return e;
}

// Two devices, a GPipe-like schedule of 2 micro-batches with transfers, W and the optimizer;
// a name that needs escaping.
Trace small_trace() {
  Trace t;
  t.source = "sim";
  t.plan = "tiny <gpt> & co";
  t.fingerprint = "xxh3:0123456789abcdef";
  t.device_names = {"gpu<0>&\"a\"", "gpu1"};
  int task = 0;
  t.events = {event(task++, 0, "compute", "forward", 0, 0.0, 1.0),
              event(task++, 0, "compute", "forward", 1, 1.0, 2.0),
              event(task++, 0, "send>1:act", "send", 0, 1.0, 1.2),
              event(task++, 1, "recv<0:act", "recv", 0, 1.0, 1.2),
              event(task++, 1, "compute", "forward", 0, 1.2, 2.2),
              event(task++, 1, "compute", "backward", 0, 2.2, 4.2),
              event(task++, 1, "compute", "backward_weight", 0, 4.2, 5.0),
              event(task++, 0, "compute", "backward", 0, 5.0, 7.0),
              event(task++, 0, "compute", "optimizer", -1, 7.0, 7.5),
              event(task++, 1, "comm", "collective", -1, 5.0, 6.0)};
  t.events[9].purpose = partition::Purpose::data_parallel;
  sort_events(t);
  return t;
}

// Minimal XML reading: every element opens and closes in order; attributes are quoted.
void expect_well_formed(const std::string& svg) {
  ASSERT_EQ(svg.rfind("<?xml", 0), 0u);
  std::vector<std::string> open;
  size_t i = svg.find("?>") + 2;
  while ((i = svg.find('<', i)) != std::string::npos) {
    const size_t end = svg.find('>', i);
    ASSERT_NE(end, std::string::npos);
    const std::string tag = svg.substr(i + 1, end - i - 1);
    ASSERT_EQ(tag.find('<'), std::string::npos) << tag;
    if (tag[0] == '/') {
      ASSERT_FALSE(open.empty()) << tag;
      EXPECT_EQ("/" + open.back(), tag);
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find(' ')));
    }
    // Attribute values are quoted; so no bare & or < in text between tags either.
    const size_t next = svg.find('<', end);
    const std::string text = svg.substr(end + 1, next == std::string::npos ? std::string::npos : next - end - 1);
    for (size_t a = text.find('&'); a != std::string::npos; a = text.find('&', a + 1)) {
      EXPECT_TRUE(std::regex_search(text.substr(a), std::regex("^&(amp|lt|gt|quot|apos);"))) << text;
    }
    i = end;
  }
  EXPECT_TRUE(open.empty());
}

double attribute(const std::string& element, const std::string& name) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(element, m, std::regex(" " + name + "=\"([-0-9.]+)\""))) << element;
  return std::stod(m[1]);
}

struct Box {
  double x, y, w, h;
  const Event* event;  // the event its tooltip names
};
std::vector<Box> boxes(const std::string& svg, const Trace& t) {
  std::vector<Box> out;
  const std::regex box("<rect class=\"ev\"[^>]*><title>[^<]*iteration (-?[0-9]+), task ([0-9]+) on [^<]*</title>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), box); it != std::sregex_iterator(); ++it) {
    const std::string e = it->str();
    const Event* event = nullptr;
    for (const Event& candidate : t.events) {
      if (candidate.task == std::stoi((*it)[2]) && candidate.iteration == std::stoi((*it)[1])) event = &candidate;
    }
    EXPECT_NE(event, nullptr) << e;
    out.push_back({attribute(e, "x"), attribute(e, "y"), attribute(e, "width"), attribute(e, "height"), event});
  }
  size_t rects = 0;  // every box has a tooltip that names its task
  for (size_t i = svg.find("class=\"ev\""); i != std::string::npos; i = svg.find("class=\"ev\"", i + 1)) ++rects;
  EXPECT_EQ(out.size(), rects);
  return out;
}

TEST(TimelineSvg, OneBoxPerEventInsideTheDrawingAreaInTimeOrder) {
  const Trace t = small_trace();
  const std::string svg = timeline_svg(t);
  expect_well_formed(svg);
  const double width = attribute(svg.substr(svg.find("<svg")), "width");
  const double height = attribute(svg.substr(svg.find("<svg")), "height");
  const std::vector<Box> b = boxes(svg, t);
  ASSERT_EQ(b.size(), t.events.size());
  std::set<const Event*> seen;
  for (const Box& box : b) {
    seen.insert(box.event);
    EXPECT_GE(box.x, 0);
    EXPECT_LE(box.x + box.w, width - 20);
    EXPECT_GT(box.w, 0);
    EXPECT_GE(box.y, 50);
    EXPECT_LE(box.y + box.h, height - 30);
  }
  EXPECT_EQ(seen.size(), t.events.size());  // one box per event, none twice
  // Across all boxes, a later start is never drawn further left, and x is proportional to time.
  std::vector<std::pair<double, double>> start_x;
  for (const Box& box : b) start_x.push_back({box.event->start_s, box.x});
  std::sort(start_x.begin(), start_x.end());
  for (size_t i = 1; i < start_x.size(); ++i) EXPECT_LE(start_x[i - 1].second, start_x[i].second);
  const double px_per_s = (start_x.back().second - start_x.front().second) / (start_x.back().first - start_x.front().first);
  for (const Box& box : b) EXPECT_NEAR(box.w, (box.event->end_s - box.event->start_s) * px_per_s, 0.2);
}

TEST(TimelineSvg, ARowPerDeviceWithLanesAndLabelsEscaped) {
  const Trace t = small_trace();
  const std::string svg = timeline_svg(t);
  // Device names on the left, escaped; the plan name in the title, escaped.
  EXPECT_NE(svg.find(">gpu&lt;0&gt;&amp;&quot;a&quot;</text>"), std::string::npos);
  EXPECT_NE(svg.find(">gpu1</text>"), std::string::npos);
  EXPECT_NE(svg.find("tiny &lt;gpt&gt; &amp; co"), std::string::npos);
  EXPECT_NE(svg.find("xxh3:0123456789abcdef"), std::string::npos);
  EXPECT_EQ(svg.find("<gpt>"), std::string::npos);
  // Device 0's boxes lie above device 1's; within a device the compute lane is the top one,
  // the communication lanes below it are thinner.
  double device0_bottom = 0, device1_top = 1e9;
  std::map<std::string, std::pair<double, double>> lane1;  // device 1: stream -> (y, height)
  for (const Box& box : boxes(svg, t)) {
    if (box.event->device == 0) device0_bottom = std::max(device0_bottom, box.y + box.h);
    if (box.event->device == 1) device1_top = std::min(device1_top, box.y), lane1[box.event->stream] = {box.y, box.h};
  }
  EXPECT_LT(device0_bottom, device1_top);
  ASSERT_EQ(lane1.size(), 3u);
  EXPECT_LT(lane1["compute"].first, lane1["comm"].first);
  EXPECT_LT(lane1["compute"].first, lane1["recv<0:act"].first);
  EXPECT_LT(lane1["comm"].second, lane1["compute"].second);
  EXPECT_NE(lane1["comm"].first, lane1["recv<0:act"].first);
  // Micro-batch numbers in the boxes that are wide enough.
  for (const char* number : {"0", "1"}) {
    EXPECT_TRUE(std::regex_search(svg, std::regex(std::string("fill=\"#[0-9a-f]{6}\" text-anchor=\"middle\">") + number + "</text>")))
        << number;
  }
  // A legend that says how the passes are told apart; a time axis in seconds with round ticks.
  for (const char* words : {"forward: solid", "backward: dark", "weight gradient W", "optimizer", "idle", "time (s)"}) {
    EXPECT_NE(svg.find(words), std::string::npos) << words;
  }
  for (const char* tick : {">0</text>", ">2</text>", ">4</text>", ">6</text>"}) EXPECT_NE(svg.find(tick), std::string::npos) << tick;
}

TEST(TimelineSvg, TicksStepOneTwoFive) {
  EXPECT_DOUBLE_EQ(tick_step(10, 10), 1);
  EXPECT_DOUBLE_EQ(tick_step(7.5, 10), 1);
  EXPECT_DOUBLE_EQ(tick_step(15, 10), 2);
  EXPECT_DOUBLE_EQ(tick_step(0.04, 10), 0.005);
  EXPECT_DOUBLE_EQ(tick_step(300, 4), 100);
}

TEST(TimelineSvg, ManyDevicesAreSampledAndTheTitleSaysSo) {
  Trace t;
  t.source = "sim";
  t.plan = "wide";
  for (int d = 0; d < 100; ++d) {
    t.device_names.push_back("gpu" + std::to_string(d));
    t.events.push_back(event(d, d, "compute", "forward", d % 4, 0.01 * d, 0.01 * d + 0.5));
  }
  const TimelineView view = timeline_view(t);
  EXPECT_TRUE(view.sampled);
  ASSERT_EQ(view.devices.size(), 64u);
  EXPECT_EQ(view.devices.front(), 0);
  EXPECT_EQ(view.devices.back(), 99);
  EXPECT_TRUE(std::is_sorted(view.devices.begin(), view.devices.end()));
  EXPECT_EQ(std::adjacent_find(view.devices.begin(), view.devices.end()), view.devices.end());
  const std::string svg = timeline_svg(t);
  expect_well_formed(svg);
  EXPECT_NE(svg.find("SAMPLED: 64 of 100 devices"), std::string::npos);
  EXPECT_EQ(boxes(svg, t).size(), 64u);
  EXPECT_NE(utilization_svg(t).find("SAMPLED: 64 of 100 devices"), std::string::npos);
  // 64 or fewer: every device, no word of sampling.
  t.events.resize(64), t.device_names.resize(64);
  EXPECT_EQ(timeline_view(t).devices.size(), 64u);
  EXPECT_EQ(timeline_svg(t).find("SAMPLED"), std::string::npos);
}

TEST(TimelineSvg, IterationsAreChosen) {
  Trace t = small_trace();
  const size_t per_iteration = t.events.size();
  for (size_t i = 0; i < per_iteration; ++i) {
    for (int it : {1, 2}) {
      Event e = t.events[i];
      e.iteration = it, e.start_s += 10 * it, e.end_s += 10 * it;
      t.events.push_back(e);
    }
  }
  sort_events(t);
  EXPECT_EQ(boxes(timeline_svg(t), t).size(), 3 * per_iteration);
  const TimelineView one = timeline_view(t, {.iterations = IterationRange{1, 1}});
  EXPECT_EQ(one.events, per_iteration);
  EXPECT_DOUBLE_EQ(one.start_s, 10);
  EXPECT_EQ(boxes(timeline_svg(t, {.iterations = IterationRange{1, -1}}), t).size(), 2 * per_iteration);
  EXPECT_THROW(timeline_view(t, {.iterations = IterationRange{5, 7}}), InputError);
}

TEST(TimelineSvg, UtilizationSharesSumToOne) {
  const Trace t = small_trace();
  const TimelineView view = timeline_view(t);
  const std::vector<UtilizationShare> s = utilization_shares(t, view);
  ASSERT_EQ(s.size(), 2u);
  // Device 0: computes 0-2, 5-7.5 (4.5 s of 7.5), sends 1-1.2 while computing: no comm-only time.
  EXPECT_NEAR(s[0].busy, 4.5 / 7.5, 1e-12);
  EXPECT_NEAR(s[0].communicating, 0, 1e-12);
  // Device 1: computes 1.2-5.0 (3.8 s), receives 1.0-1.2 and all-reduces 5-6: 1.2 s comm only.
  EXPECT_NEAR(s[1].busy, 3.8 / 7.5, 1e-12);
  EXPECT_NEAR(s[1].communicating, 1.2 / 7.5, 1e-12);
  for (const UtilizationShare& u : s) EXPECT_NEAR(u.busy + u.communicating + u.idle, 1, 1e-12);
  const std::string svg = utilization_svg(t);
  expect_well_formed(svg);
  EXPECT_NE(svg.find("compute 60.0%"), std::string::npos);
  EXPECT_NE(svg.find("comm 16.0%"), std::string::npos);
}

TEST(TimelineSvg, RefusesWhatItCannotDraw) {
  EXPECT_THROW(timeline_svg(Trace{}), InputError);
  Trace t = small_trace();
  t.events[0].device = -1;
  EXPECT_THROW(timeline_svg(t), InputError);
}

// What the reader accepts is drawn: many streams on a device share lanes past a dozen, times
// far from zero with a tiny span give a bounded axis, negative iterations are iterations.
TEST(TimelineSvg, DrawsAwkwardTraces) {
  Trace t;
  for (int peer = 0; peer < 40; ++peer) {
    t.events.push_back(event(peer, 0, "send>" + std::to_string(peer) + ":grad", "send", -1, 1e10, 1e10 + 1e-8));
  }
  t.events.push_back(event(99, 1, "compute", "forward", 2000000000, 1e10, 1e10 + 2e-8, -5));
  const std::string svg = timeline_svg(t);
  expect_well_formed(svg);
  EXPECT_EQ(boxes(svg, t).size(), t.events.size());
  EXPECT_NE(svg.find("30 more streams"), std::string::npos);  // compute + 10 lanes + the rest
  EXPECT_LT(svg.size(), 200000u);
  EXPECT_NE(svg.find("iterations -5-0"), std::string::npos);
  expect_well_formed(utilization_svg(t));
}

TEST(TimelineSvg, TheSameTraceGivesTheSameBytes) {
  EXPECT_EQ(timeline_svg(small_trace()), timeline_svg(small_trace()));
  EXPECT_EQ(xml_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
}

}  // namespace
}  // namespace hetflow::traces
