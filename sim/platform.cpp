// SimGrid platform construction from a ClusterSpec (see platform.h).
#include "sim/platform.h"

#include <string>

namespace duet::sim {

namespace sg4 = simgrid::s4u;
using Dir = sg4::LinkInRoute::Direction;

namespace {

sg4::Link* MakeLink(sg4::NetZone* zone, const std::string& name, const LinkSpec& spec) {
  return zone->create_split_duplex_link(name, spec.bandwidth)->set_latency(spec.latency)->seal();
}

}  // namespace

Platform BuildPlatform(const ClusterSpec& cluster) {
  Platform p;
  auto* zone = sg4::create_full_zone("cluster");
  struct GpuLinks {
    sg4::Link* nvlink;
    sg4::Link* pcie;
    sg4::Link* nic;
  };
  std::vector<std::vector<GpuLinks>> links(cluster.nodes.size());
  p.gpus.resize(cluster.nodes.size());
  for (std::size_t n = 0; n < cluster.nodes.size(); ++n) {
    const NodeSpec& node = cluster.nodes[n];
    for (int g = 0; g < node.gpus; ++g) {
      const std::string base = node.name + "-gpu" + std::to_string(g);
      p.gpus[n].push_back(zone->create_host(base, node.gpu.bf16_flops)->seal());
      links[n].push_back({MakeLink(zone, base + "-nvlink", node.nvlink),
                          MakeLink(zone, base + "-pcie", node.pcie),
                          MakeLink(zone, base + "-nic", node.nic)});
    }
  }
  auto* sw = zone->create_link("switch", cluster.switch_link.bandwidth)
                 ->set_latency(cluster.switch_link.latency)
                 ->seal();
  auto* fe_link = MakeLink(zone, "frontend-link", cluster.frontend_link);
  p.frontend = zone->create_host("frontend", 1e9)->seal();

  for (std::size_t a = 0; a < cluster.nodes.size(); ++a) {
    for (std::size_t ga = 0; ga < p.gpus[a].size(); ++ga) {
      sg4::Host* src = p.gpus[a][ga];
      const GpuLinks& la = links[a][ga];
      // Frontend <-> GPU.
      zone->add_route(p.frontend->get_netpoint(), src->get_netpoint(), nullptr, nullptr,
                      {{fe_link, Dir::UP}, {sw, Dir::NONE}, {la.nic, Dir::DOWN}}, false);
      zone->add_route(src->get_netpoint(), p.frontend->get_netpoint(), nullptr, nullptr,
                      {{la.nic, Dir::UP}, {sw, Dir::NONE}, {fe_link, Dir::DOWN}}, false);
      for (std::size_t b = 0; b < cluster.nodes.size(); ++b) {
        for (std::size_t gb = 0; gb < p.gpus[b].size(); ++gb) {
          if (a == b && ga == gb) continue;
          const GpuLinks& lb = links[b][gb];
          std::vector<sg4::LinkInRoute> route;
          if (a == b) {
            route = {{la.nvlink, Dir::UP}, {lb.nvlink, Dir::DOWN}};
          } else {
            route = {{la.pcie, Dir::UP},
                     {la.nic, Dir::UP},
                     {sw, Dir::NONE},
                     {lb.nic, Dir::DOWN},
                     {lb.pcie, Dir::DOWN}};
          }
          zone->add_route(src->get_netpoint(), p.gpus[b][gb]->get_netpoint(), nullptr, nullptr,
                          route, false);
        }
      }
    }
  }
  zone->seal();
  return p;
}

}  // namespace duet::sim
