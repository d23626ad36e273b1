// Fuzz target: what discovery reads from etcd (backend/discovery): the gateway's answers to a
// lease grant, a keep-alive, a range and a write, a worker's record, and an etcd:// endpoint. The
// first byte picks the parser, the rest is its input. Any input is parsed or rejected with an
// error, never a crash; a record that parses re-encodes to one that parses again.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "backend/discovery/etcd.h"
#include "backend/discovery/registration.h"
#include "common/status.h"

using namespace duet::backend::discovery;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 6) {
    case 0:
      (void)ParseGrantResponse(body);
      break;
    case 1:
      (void)ParseKeepAliveResponse(body);
      break;
    case 2:
      (void)ParseRangeResponse(body);
      break;
    case 3:
      (void)ParseWriteResponse(body);
      break;
    case 4:
      if (auto r = ParseWorkerRecord(body); r.ok())
        DUET_CHECK(ParseWorkerRecord(EncodeWorkerRecord(*r)).ok());
      break;
    default:
      (void)ParseEtcdUrl(body);
      break;
  }
  return 0;
}
