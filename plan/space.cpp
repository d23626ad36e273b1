#include "plan/space.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <optional>
#include <tuple>

#include "common/status.h"
#include "common/text.h"
#include "sim/cluster_spec.h"

namespace duet::plan {
namespace {

bool Placeable(int tp, int gpus, int gpus_per_node) {
  return sim::NodesSpanned(tp, gpus, gpus_per_node) > 0;
}

// Nodes a first fit needs for `groups` of (count, GPUs each) instances, in order; an instance
// larger than a node takes fresh whole nodes (sim::NodesSpanned of them).
int NodesNeeded(const std::vector<std::pair<int, int>>& groups, int gpus_per_node) {
  std::vector<int> free;
  for (const auto& group : groups) {
    const int gpus = group.second;
    for (int k = 0; k < group.first; ++k) {
      if (gpus > gpus_per_node) {
        free.insert(free.end(), static_cast<std::size_t>(gpus / gpus_per_node), 0);
        continue;
      }
      auto it = std::find_if(free.begin(), free.end(), [gpus](int f) { return f >= gpus; });
      if (it == free.end()) it = free.insert(free.end(), gpus_per_node);
      *it -= gpus;
    }
  }
  return static_cast<int>(free.size());
}

// The tier choices a candidate may take: SSD only below DRAM, and none for a candidate with an
// instance across nodes (its KV tiers are per node).
bool TiersAllowed(double dram, double ssd, bool spans_nodes) {
  return !(ssd > 0 && dram <= 0) && !(spans_nodes && (dram > 0 || ssd > 0));
}

// "3xtp4", or "3xtp4dp2" with data-parallel attention.
std::string GroupKey(int count, int tp, int dp) {
  std::string k = std::to_string(count) + "xtp" + std::to_string(tp);
  if (dp > 1) k.append("dp").append(std::to_string(dp));
  return k;
}

// "3 TP4", or "3 TP4xDP2".
std::string GroupLayout(int count, int tp, int dp) {
  return std::to_string(count) + " TP" + std::to_string(tp) +
         (dp > 1 ? "xDP" + std::to_string(dp) : "");
}

}  // namespace

std::string Candidate::Key() const {
  std::string k = gpu_named ? GpuKeyName(gpu) + "-" : "";
  k.append(pd ? "pd-" : "colo-");
  k.append(GroupKey(prefill, prefill_tp, prefill_dp));
  if (pd) k.append("-").append(GroupKey(decode, decode_tp, decode_dp));
  k.append("-b").append(std::to_string(token_budget));
  k.append("-dram").append(ShortNumber(dram_gib));
  k.append("-ssd").append(ShortNumber(ssd_tib));
  k.append("-").append(policies::ToString(router));
  return k;
}

std::string Candidate::Layout() const {
  std::string layout = pd ? GroupLayout(prefill, prefill_tp, prefill_dp) + " prefill + " +
                                GroupLayout(decode, decode_tp, decode_dp) + " decode"
                          : GroupLayout(prefill, prefill_tp, prefill_dp) + " colocated";
  return gpu_named ? layout + " on " + GpuKeyName(gpu) : layout;
}

std::string GpuKeyName(const std::string& gpu) {
  return sim::IsBundledName(gpu) ? gpu : std::filesystem::path(gpu).stem().string();
}

std::size_t CountCandidates(const SpaceOptions& o) {
  std::size_t shapes[2] = {0, 0};  // by whether an instance spans nodes
  const int gpn = o.gpus_per_node;
  for (int tp : o.tp) {
    for (int dp : o.dp) {
      const int pgpus = tp * dp;
      if (!Placeable(tp, pgpus, gpn)) continue;
      if (o.colocated) shapes[pgpus > gpn] += static_cast<std::size_t>(o.max_gpus / pgpus);
      if (!o.pd) continue;
      for (int dtp : o.decode_tp) {
        for (int ddp : o.decode_dp) {
          const int dgpus = dtp * ddp;
          if (!Placeable(dtp, dgpus, gpn)) continue;
          for (int p = 1; p * pgpus + dgpus <= o.max_gpus; ++p)
            shapes[pgpus > gpn || dgpus > gpn] +=
                static_cast<std::size_t>((o.max_gpus - p * pgpus) / dgpus);
        }
      }
    }
  }
  std::size_t total = 0;
  for (int spans = 0; spans < 2; ++spans) {
    std::size_t tiers = 0;
    for (double dram : o.dram_gib)
      for (double ssd : o.ssd_tib) tiers += TiersAllowed(dram, ssd, spans) ? 1 : 0;
    total += shapes[spans] * tiers;
  }
  return total * o.token_budgets.size() * o.routers.size() * o.gpus.size();
}

std::vector<Candidate> Enumerate(const SpaceOptions& o, const Prices& prices) {
  std::vector<Candidate> shapes;  // layout and counts; the rest is multiplied in below
  for (int tp : o.tp) {
    for (int dp : o.dp) {
      const int pgpus = tp * dp;
      if (!Placeable(tp, pgpus, o.gpus_per_node)) continue;
      if (o.colocated) {
        for (int n = 1; n * pgpus <= o.max_gpus; ++n) {
          Candidate c;
          c.prefill = n;
          c.prefill_tp = tp;
          c.prefill_dp = dp;
          c.gpus = n * pgpus;
          c.nodes = NodesNeeded({{n, pgpus}}, o.gpus_per_node);
          shapes.push_back(c);
        }
      }
      if (!o.pd) continue;
      for (int dtp : o.decode_tp) {
        for (int ddp : o.decode_dp) {
          const int dgpus = dtp * ddp;
          if (!Placeable(dtp, dgpus, o.gpus_per_node)) continue;
          for (int p = 1; p * pgpus + dgpus <= o.max_gpus; ++p) {
            for (int d = 1; p * pgpus + d * dgpus <= o.max_gpus; ++d) {
              Candidate c;
              c.pd = true;
              c.prefill = p;
              c.prefill_tp = tp;
              c.prefill_dp = dp;
              c.decode = d;
              c.decode_tp = dtp;
              c.decode_dp = ddp;
              c.gpus = p * pgpus + d * dgpus;
              c.nodes = NodesNeeded({{p, pgpus}, {d, dgpus}}, o.gpus_per_node);
              shapes.push_back(c);
            }
          }
        }
      }
    }
  }
  std::vector<Candidate> out;
  for (const std::string& gpu : o.gpus) {
    auto price = prices.gpu_hour.find(gpu);
    DUET_CHECK_MSG(price != prices.gpu_hour.end(), "no price for GPU " + gpu);
    for (Candidate shape : shapes) {
      shape.gpu = gpu;
      shape.gpu_named = o.gpus.size() > 1;
      const bool spans = shape.prefill_tp * shape.prefill_dp > o.gpus_per_node ||
                         shape.decode_tp * shape.decode_dp > o.gpus_per_node;
      for (Tokens budget : o.token_budgets) {
        for (double dram : o.dram_gib) {
          for (double ssd : o.ssd_tib) {
            if (!TiersAllowed(dram, ssd, spans)) continue;
            for (policies::RouterKind router : o.routers) {
              Candidate c = shape;
              c.token_budget = budget;
              c.dram_gib = dram;
              c.ssd_tib = ssd;
              c.router = router;
              c.cost_per_hour = c.gpus * price->second +
                                c.nodes * (dram * prices.dram_gib_hour + ssd * prices.ssd_tib_hour);
              out.push_back(c);
            }
          }
        }
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return std::make_tuple(a.cost_per_hour, a.gpus, a.pd, a.Key()) <
           std::make_tuple(b.cost_per_hour, b.gpus, b.pd, b.Key());
  });
  return out;
}

std::vector<std::size_t> CheaperNeighbours(const std::vector<Candidate>& all, std::size_t winner) {
  const Candidate& w = all[winner];
  constexpr std::size_t kFields = 9;
  auto fields = [](const Candidate& c) {
    return std::array<double, kFields>{static_cast<double>(c.prefill),
                                       static_cast<double>(c.decode),
                                       static_cast<double>(c.prefill_tp),
                                       static_cast<double>(c.prefill_dp),
                                       static_cast<double>(c.decode_tp),
                                       static_cast<double>(c.decode_dp),
                                       static_cast<double>(c.token_budget),
                                       c.dram_gib,
                                       c.ssd_tib};
  };
  const auto wf = fields(w);
  // Per dimension, the closest lower value among candidates equal to the winner elsewhere.
  std::array<std::optional<std::size_t>, kFields> best;
  for (std::size_t k = 0; k < all.size(); ++k) {
    const Candidate& c = all[k];
    if (c.gpu != w.gpu || c.pd != w.pd || c.router != w.router ||
        !(c.cost_per_hour < w.cost_per_hour))
      continue;
    const auto cf = fields(c);
    std::size_t differs = 0;
    int count = 0;
    for (std::size_t i = 0; i < kFields; ++i) {
      if (cf[i] != wf[i]) {
        differs = i;
        ++count;
      }
    }
    if (count != 1 || cf[differs] > wf[differs]) continue;
    auto& b = best[differs];
    if (!b || fields(all[*b])[differs] < cf[differs]) b = k;
  }
  std::vector<std::size_t> out;
  for (const auto& b : best)
    if (b) out.push_back(*b);
  return out;
}

nlohmann::json OnHardware(const nlohmann::json& base, const std::string& model,
                          const std::string& gpu, const std::string& ref_dir,
                          const std::string& data_dir, std::string* pricing) {
  nlohmann::json doc = base;
  pricing->clear();
  bool other_hardware = false;
  if (!model.empty()) {
    other_hardware |= doc.value("model", "") != model;
    doc["model"] = model;
  }
  if (!gpu.empty()) {
    other_hardware |= doc["nodes"][0].value("gpu", "") != gpu;
    doc["nodes"][0]["gpu"] = gpu;
  }
  sim::AbsolutizeClusterRefs(doc, ref_dir);
  if (!other_hardware || !doc.contains("cost_model") ||
      doc["cost_model"].value("kind", "") != "fitted")
    return doc;
  // The bundled profile of this GPU and model (sim/profiles/GPU-MODEL.json), if there is one.
  const std::string doc_gpu = doc["nodes"][0].value("gpu", ""), doc_model = doc.value("model", "");
  const std::string bundled = doc_gpu + "-" + doc_model;
  if (!doc_gpu.empty() && !doc_model.empty() && sim::IsBundledName(doc_gpu) &&
      sim::IsBundledName(doc_model) &&
      std::filesystem::exists(std::filesystem::path(data_dir) / "sim" / "profiles" /
                              (bundled + ".json"))) {
    *pricing = "pricing steps with the bundled profile " + bundled;
    doc["cost_model"] = {{"kind", "fitted"}, {"profile", bundled}};
  } else {
    *pricing =
        "the base's step profile was measured on another model or GPU, and no bundled "
        "one is of " +
        doc_model + " on " + doc_gpu + ": pricing steps with the roofline";
    doc["cost_model"] = {{"kind", "roofline"}};
  }
  return doc;
}

nlohmann::json ClusterDocument(const nlohmann::json& base, const Candidate& c) {
  nlohmann::json doc = base;
  doc["name"] = c.Key();
  doc["description"] = "duet plan candidate: " + c.Layout() + ", token budget " +
                       std::to_string(c.token_budget) + ", " + ShortNumber(c.dram_gib) +
                       " GiB DRAM and " + ShortNumber(c.ssd_tib) + " TiB SSD per node, router " +
                       policies::ToString(c.router) + ".";
  doc["router"] = policies::ToString(c.router);
  // One node group: the base's first, as many as the first fit needs.
  nlohmann::json node = base.at("nodes").at(0);
  node["count"] = c.nodes;
  doc["nodes"] = nlohmann::json::array({node});
  if (c.pd) {
    doc["instances"] = {{{"role", "prefill"}, {"count", c.prefill}, {"tp", c.prefill_tp}},
                        {{"role", "decode"}, {"count", c.decode}, {"tp", c.decode_tp}}};
    if (c.decode_dp > 1) doc["instances"][1]["dp"] = c.decode_dp;
  } else {
    doc["instances"] = {{{"role", "colocated"}, {"count", c.prefill}, {"tp", c.prefill_tp}}};
  }
  if (c.prefill_dp > 1) doc["instances"][0]["dp"] = c.prefill_dp;
  doc["engine"]["max_num_batched_tokens"] = c.token_budget;
  const nlohmann::json base_tiers = base.value("tiers", nlohmann::json::object());
  nlohmann::json tiers = nlohmann::json::object();
  if (base_tiers.contains("remote")) tiers["remote"] = base_tiers["remote"];
  if (c.dram_gib > 0) {
    nlohmann::json dram = base_tiers.value(
        "dram", nlohmann::json{
                    {"placement", "write-through"}, {"eviction", "lru"}, {"bandwidth_GBps", 300}});
    dram["capacity_gib"] = c.dram_gib;
    tiers["dram"] = dram;
  }
  if (c.ssd_tib > 0) {
    nlohmann::json ssd = base_tiers.value("ssd", nlohmann::json{{"placement", "write-back"},
                                                                {"eviction", "arc"},
                                                                {"read_GBps", 28},
                                                                {"write_GBps", 14}});
    ssd["capacity_gib"] = c.ssd_tib * 1024;
    tiers["ssd"] = ssd;
  }
  if (tiers.empty()) {
    doc.erase("tiers");
  } else {
    doc["tiers"] = tiers;
  }
  return doc;
}

}  // namespace duet::plan
