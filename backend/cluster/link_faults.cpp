// Faults on a worker's link (see link_faults.h).
#include "backend/cluster/link_faults.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace duet::backend::cluster {

Result<LinkFault> ParseLinkFault(const std::string& text, const std::string& where) {
  std::istringstream in(text);
  LinkFault f;
  std::string kind, rest;
  if (!(in >> f.instance >> kind >> f.nth_events) || (in >> rest) || f.instance < 0 ||
      f.nth_events < 1 || (kind != "corrupt" && kind != "silence")) {
    return Status::Error(where +
                         ": must read \"INSTANCE FAULT N\" (FAULT: corrupt or silence; "
                         "INSTANCE >= 0, N >= 1), e.g. \"1 corrupt 3\"; got '" +
                         text + "'");
  }
  f.kind = kind == "corrupt" ? LinkFault::Kind::kCorrupt : LinkFault::Kind::kSilence;
  return f;
}

Result<std::optional<LinkFault>> LinkFaultFromEnvironment() {
  const char* path = std::getenv(kWorkerLinkFaultEnv);
  if (path == nullptr || *path == '\0') return std::optional<LinkFault>();
  const std::string where = std::string(kWorkerLinkFaultEnv) + "=" + path;
  std::ifstream in(path);
  if (!in) return Status::Error(where + ": cannot read the file");
  std::stringstream text;
  text << in.rdbuf();
  Result<LinkFault> f = ParseLinkFault(text.str(), where);
  if (!f.ok()) return f.status();
  f->path = path;
  return std::optional<LinkFault>(std::move(*f));
}

void FaultInjectingLink::SetInstance(policies::InstanceId instance) {
  std::lock_guard lock(mu_);
  instance_ = instance;
}

void FaultInjectingLink::operator()(MessageKind kind, const std::string& body) {
  // Under the lock, so that no frame of another thread slips past the point of a silence (the
  // connection's Send never blocks).
  std::lock_guard lock(mu_);
  if (silent_) return;
  if (fault_ && fault_->instance == instance_ && kind == MessageKind::kEvents &&
      ++events_sent_ == fault_->nth_events) {
    std::error_code ignored;
    std::filesystem::remove(fault_->path, ignored);  // once: a worker started again runs clean
    const bool corrupt = fault_->kind == LinkFault::Kind::kCorrupt;
    std::fprintf(stderr, "duet worker: fault injection: events frame %lld %s\n",
                 static_cast<long long>(events_sent_),
                 corrupt ? "sent corrupt" : "and everything after it not sent");
    fault_.reset();
    if (!corrupt) {
      silent_ = true;
      return;
    }
    // 0xc1 is no MessagePack type: the body cannot be decoded at all.
    send_(kind, std::string(body.size(), '\xc1'));
    return;
  }
  send_(kind, body);
}

}  // namespace duet::backend::cluster
