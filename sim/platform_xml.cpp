// PlatformSpec -> SimGrid platform XML (DTD 4.1). SimGrid 3.32 reads no star zones from XML,
// so the same topology is written with Floyd zones: each node zone routes its hosts to its
// gateway router (Full node zones list every route, GPU to GPU and GPU to gateway through its
// rail's NIC); the switch of a zone of zones becomes a router in a zone of its own, reached
// from a member over the member's star route and left towards it over the same links
// reversed; a zone of zones is entered from its parent through a router next to its switch.
// Routes then cross the same links as in the star zones of the in-memory platform.
#include <map>
#include <sstream>

#include "model/units.hpp"
#include "sim/platform_spec.hpp"

namespace hetflow::sim {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string number(double v) { return model::units::format_number(v); }

class XmlWriter {
 public:
  explicit XmlWriter(const PlatformSpec& spec) : spec_(spec) {
    for (size_t z = 0; z < spec_.zones.size(); ++z) {
      if (spec_.zones[z].parent >= 0) children_[spec_.zones[z].parent].push_back(static_cast<int>(z));
    }
    for (size_t l = 0; l < spec_.links.size(); ++l) links_of_zone_[spec_.links[l].zone].push_back(static_cast<int>(l));
  }

  std::string write() {
    out_ << "<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
         << "<platform version=\"4.1\">\n";
    zone(0, 1);
    out_ << "</platform>\n";
    return out_.str();
  }

 private:
  std::string indent(int depth) const { return std::string(static_cast<size_t>(2 * depth), ' '); }

  std::string link_ctn(const Hop& hop, bool reverse = false) const {
    const LinkSpec& l = spec_.links[static_cast<size_t>(hop.link)];
    return "<link_ctn id=\"" + escape(l.name) + "\" direction=\"" + ((hop.up != reverse) ? "UP" : "DOWN") + "\"/>";
  }

  // A zone whose members are zones: they meet at its switch.
  static bool has_switch(const ZoneSpec& z) {
    for (const StarRoute& r : z.star_routes) {
      if (r.is_zone) return true;
    }
    return false;
  }

  std::string gateway_of(int zone) const {
    const ZoneSpec& z = spec_.zones[static_cast<size_t>(zone)];
    if (!z.gateway.empty() && z.gateway.rfind("gw:node:", 0) == 0) return z.gateway;
    return "in:" + z.name;  // zones of zones are entered through a router in front of their switch
  }

  void zone(int index, int depth) {
    const ZoneSpec& z = spec_.zones[static_cast<size_t>(index)];
    if (z.name.rfind("gwzone:", 0) == 0) return;  // gateways of zones of zones: their switch router serves
    const std::string pad = indent(depth);
    out_ << pad << "<zone id=\"" << escape(z.name) << "\" routing=\"" << (z.full ? "Full" : "Floyd") << "\">\n";
    // The DTD's order: zones, then hosts and routers, then links, then routes.
    for (int child : children_[index]) zone(child, depth + 1);
    const bool sw = has_switch(z);
    const bool entered_from_parent = sw && z.parent >= 0;
    const std::string name = escape(z.name);
    if (sw) {
      out_ << pad << "  <zone id=\"swzone:" << name << "\" routing=\"None\"><router id=\"sw:" << name << "\"/></zone>\n";
    }
    if (entered_from_parent) {
      out_ << pad << "  <zone id=\"inzone:" << name << "\" routing=\"None\"><router id=\"in:" << name << "\"/></zone>\n";
    }
    for (int h : z.hosts) {
      out_ << pad << "  <host id=\"" << escape(spec_.hosts[static_cast<size_t>(h)].name) << "\" speed=\""
           << number(spec_.hosts[static_cast<size_t>(h)].speed_flops_per_s) << "f\"/>\n";
    }
    if (!z.router.empty()) out_ << pad << "  <router id=\"" << escape(z.router) << "\"/>\n";
    for (int l : links_of_zone_[index]) {
      const LinkSpec& link = spec_.links[static_cast<size_t>(l)];
      out_ << pad << "  <link id=\"" << escape(link.name) << "\" bandwidth=\"" << number(link.bandwidth_bytes_per_s)
           << "Bps\" latency=\"" << number(link.latency_s) << "s\" sharing_policy=\"SPLITDUPLEX\"/>\n";
    }
    // SimGrid forbids empty routes: where a route crosses nothing, it crosses a free FATPIPE.
    if (sw) {
      out_ << pad << "  <link id=\"free:" << name << "\" bandwidth=\"1e18Bps\" latency=\"0s\" sharing_policy=\"FATPIPE\"/>\n";
    }
    if (entered_from_parent) {
      out_ << pad << "  <zoneRoute src=\"inzone:" << name << "\" dst=\"swzone:" << name << "\" gw_src=\"in:" << name
           << "\" gw_dst=\"sw:" << name << "\"><link_ctn id=\"free:" << name << "\"/></zoneRoute>\n";
    }
    for (const StarRoute& r : z.star_routes) {
      if (!r.is_zone) {
        out_ << pad << "  <route src=\"" << escape(spec_.hosts[static_cast<size_t>(r.member)].name) << "\" dst=\""
             << escape(z.router) << "\">";
        for (const Hop& hop : r.hops) out_ << link_ctn(hop);
        out_ << "</route>\n";
        continue;
      }
      const ZoneSpec& child = spec_.zones[static_cast<size_t>(r.member)];
      if (child.name.rfind("gwzone:", 0) == 0) continue;
      const std::string gw = gateway_of(r.member);
      // Up: the member's hops; down: the same hops reversed.
      out_ << pad << "  <zoneRoute src=\"" << escape(child.name) << "\" dst=\"swzone:" << escape(z.name)
           << "\" gw_src=\"" << escape(gw) << "\" gw_dst=\"sw:" << escape(z.name) << "\" symmetrical=\"NO\">";
      for (const Hop& hop : r.hops) out_ << link_ctn(hop);
      if (r.hops.empty()) out_ << "<link_ctn id=\"free:" << name << "\"/>";
      out_ << "</zoneRoute>\n";
      out_ << pad << "  <zoneRoute src=\"swzone:" << escape(z.name) << "\" dst=\"" << escape(child.name)
           << "\" gw_src=\"sw:" << escape(z.name) << "\" gw_dst=\"" << escape(gw) << "\" symmetrical=\"NO\">";
      for (size_t i = r.hops.size(); i-- > 0;) out_ << link_ctn(r.hops[i], true);
      if (r.hops.empty()) out_ << "<link_ctn id=\"free:" << name << "\"/>";
      out_ << "</zoneRoute>\n";
    }
    for (const PairRoute& r : z.pair_routes) {
      auto point = [&](int host) { return escape(host >= 0 ? spec_.hosts[static_cast<size_t>(host)].name : z.router); };
      out_ << pad << "  <route src=\"" << point(r.from) << "\" dst=\"" << point(r.to) << "\" symmetrical=\"NO\">";
      for (const Hop& hop : r.hops) out_ << link_ctn(hop);
      out_ << "</route>\n";
    }
    for (const ZoneRoute& r : z.zone_routes) {
      out_ << pad << "  <zoneRoute src=\"" << escape(spec_.zones[static_cast<size_t>(r.from_zone)].name) << "\" dst=\""
           << escape(spec_.zones[static_cast<size_t>(r.to_zone)].name) << "\" gw_src=\"" << escape(gateway_of(r.from_zone))
           << "\" gw_dst=\"" << escape(gateway_of(r.to_zone)) << "\" symmetrical=\"NO\">";
      for (const Hop& hop : r.hops) out_ << link_ctn(hop);
      out_ << "</zoneRoute>\n";
    }
    out_ << pad << "</zone>\n";
  }

  const PlatformSpec& spec_;
  std::map<int, std::vector<int>> children_;
  std::map<int, std::vector<int>> links_of_zone_;
  std::ostringstream out_;
};

}  // namespace

std::string platform_xml(const PlatformSpec& spec) { return XmlWriter(spec).write(); }

}  // namespace hetflow::sim
