// SimGrid platform construction from a ClusterSpec (see platform.h).
#include "sim/platform.h"

#include <xbt/log.h>

#include <string>

namespace duet::sim {

namespace sg4 = simgrid::s4u;
using Dir = sg4::LinkInRoute::Direction;

namespace {

sg4::Link* MakeLink(sg4::NetZone* zone, const std::string& name, const LinkSpec& spec) {
  return zone->create_split_duplex_link(name, spec.bandwidth)->set_latency(spec.latency)->seal();
}

}  // namespace

std::unique_ptr<sg4::Engine> MakeEngine() {
  int argc = 1;
  static char arg0[] = "duet";
  char* argv[] = {arg0, nullptr};
  auto engine = std::make_unique<sg4::Engine>(&argc, argv);
  xbt_log_control_set("root.thresh:critical");
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/crosstraffic:0");
  sg4::Engine::set_config("network/TCP-gamma:0");
  sg4::Engine::set_config("network/weight-S:0");
  sg4::Engine::set_config("contexts/factory:raw");
  return engine;
}

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

  // KV tiers: node hosts (DRAM, SSD) and the remote store.
  const TiersSpec& tiers = cluster.tiers;
  std::vector<sg4::Link*> host_mem(cluster.nodes.size()), host_nic(cluster.nodes.size());
  std::vector<sg4::Link*> ssd_read(cluster.nodes.size()), ssd_write(cluster.nodes.size());
  sg4::Link* remote_link = nullptr;
  if (tiers.any()) {
    const LinkSpec mem = tiers.dram.enabled ? tiers.dram.link : LinkSpec{200 * kGB, 0};
    for (std::size_t n = 0; n < cluster.nodes.size(); ++n) {
      const std::string base = cluster.nodes[n].name + "-host";
      p.node_hosts.push_back(zone->create_host(base, 1e9)->seal());
      // The SSD is a host behind one link per direction: a disk's read and write bandwidth,
      // shared by every transfer to or from it. (SimGrid disks are not used: their I/O
      // activities cannot be waited on together with communications.)
      if (tiers.ssd.enabled) {
        const std::string ssd = cluster.nodes[n].name + "-ssd";
        p.ssds.push_back(zone->create_host(ssd, 1e9)->seal());
        ssd_read[n] = zone->create_link(ssd + "-read", tiers.ssd.read_bw)
                          ->set_latency(tiers.ssd.read_latency)
                          ->seal();
        ssd_write[n] = zone->create_link(ssd + "-write", tiers.ssd.write_bw)
                           ->set_latency(tiers.ssd.write_latency)
                           ->seal();
      }
      // Host memory is one resource that reads and writes share.
      host_mem[n] =
          zone->create_link(base + "-mem", mem.bandwidth)->set_latency(mem.latency)->seal();
      if (tiers.remote.enabled)
        host_nic[n] = MakeLink(zone, base + "-nic", cluster.nodes[n].host_nic);
    }
    if (tiers.remote.enabled) {
      p.remote_store = zone->create_host("remote-store", 1e9)->seal();
      remote_link = MakeLink(zone, "remote-store-link", tiers.remote.link);
    }
  }

  for (std::size_t a = 0; a < cluster.nodes.size(); ++a) {
    for (std::size_t ga = 0; ga < p.gpus[a].size(); ++ga) {
      sg4::Host* src = p.gpus[a][ga];
      const GpuLinks& la = links[a][ga];
      // Frontend <-> GPU.
      zone->add_route(p.frontend->get_netpoint(), src->get_netpoint(), nullptr, nullptr,
                      {{fe_link, Dir::UP}, {sw, Dir::NONE}, {la.nic, Dir::DOWN}}, false);
      zone->add_route(src->get_netpoint(), p.frontend->get_netpoint(), nullptr, nullptr,
                      {{la.nic, Dir::UP}, {sw, Dir::NONE}, {fe_link, Dir::DOWN}}, false);
      if (!p.node_hosts.empty()) {
        sg4::Host* host = p.node_hosts[a];
        zone->add_route(src->get_netpoint(), host->get_netpoint(), nullptr, nullptr,
                        {{la.pcie, Dir::UP}, {host_mem[a], Dir::NONE}}, false);
        zone->add_route(host->get_netpoint(), src->get_netpoint(), nullptr, nullptr,
                        {{host_mem[a], Dir::NONE}, {la.pcie, Dir::DOWN}}, false);
      }
      if (!p.ssds.empty()) {
        sg4::Host* ssd = p.ssds[a];
        zone->add_route(src->get_netpoint(), ssd->get_netpoint(), nullptr, nullptr,
                        {{la.pcie, Dir::UP}, {host_mem[a], Dir::NONE}, {ssd_write[a], Dir::NONE}},
                        false);
        zone->add_route(ssd->get_netpoint(), src->get_netpoint(), nullptr, nullptr,
                        {{ssd_read[a], Dir::NONE}, {host_mem[a], Dir::NONE}, {la.pcie, Dir::DOWN}},
                        false);
      }
      if (p.remote_store) {
        zone->add_route(
            src->get_netpoint(), p.remote_store->get_netpoint(), nullptr, nullptr,
            {{la.pcie, Dir::UP}, {la.nic, Dir::UP}, {sw, Dir::NONE}, {remote_link, Dir::DOWN}},
            false);
        zone->add_route(
            p.remote_store->get_netpoint(), src->get_netpoint(), nullptr, nullptr,
            {{remote_link, Dir::UP}, {sw, Dir::NONE}, {la.nic, Dir::DOWN}, {la.pcie, Dir::DOWN}},
            false);
      }
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
  for (std::size_t n = 0; n < p.ssds.size(); ++n) {
    // DRAM <-> SSD on one node.
    const auto host = p.node_hosts[n]->get_netpoint();
    const auto ssd = p.ssds[n]->get_netpoint();
    zone->add_route(host, ssd, nullptr, nullptr,
                    {{host_mem[n], Dir::NONE}, {ssd_write[n], Dir::NONE}}, false);
    zone->add_route(ssd, host, nullptr, nullptr,
                    {{ssd_read[n], Dir::NONE}, {host_mem[n], Dir::NONE}}, false);
    if (p.remote_store) {
      const auto remote = p.remote_store->get_netpoint();
      zone->add_route(ssd, remote, nullptr, nullptr,
                      {{ssd_read[n], Dir::NONE},
                       {host_nic[n], Dir::UP},
                       {sw, Dir::NONE},
                       {remote_link, Dir::DOWN}},
                      false);
      zone->add_route(remote, ssd, nullptr, nullptr,
                      {{remote_link, Dir::UP},
                       {sw, Dir::NONE},
                       {host_nic[n], Dir::DOWN},
                       {ssd_write[n], Dir::NONE}},
                      false);
    }
  }
  if (p.remote_store) {
    for (std::size_t n = 0; n < p.node_hosts.size(); ++n) {
      const auto remote = p.remote_store->get_netpoint();
      const auto host = p.node_hosts[n]->get_netpoint();
      zone->add_route(host, remote, nullptr, nullptr,
                      {{host_mem[n], Dir::NONE},
                       {host_nic[n], Dir::UP},
                       {sw, Dir::NONE},
                       {remote_link, Dir::DOWN}},
                      false);
      zone->add_route(remote, host, nullptr, nullptr,
                      {{remote_link, Dir::UP},
                       {sw, Dir::NONE},
                       {host_nic[n], Dir::DOWN},
                       {host_mem[n], Dir::NONE}},
                      false);
    }
  }
  zone->seal();
  return p;
}

}  // namespace duet::sim
