// Fuzz target: what discovery reads from etcd (backend/discovery): the gateway's answers to a
// lease grant, a keep-alive, a range, a write and a transaction, a worker's record, a slot claim,
// and an etcd:// endpoint. The first byte picks the parser, the rest is its input. Any input is
// parsed or rejected with an error, never a crash; a record or claim that parses re-encodes to
// one that parses again.
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
  switch (data[0] % 8) {
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
    case 5:
      (void)ParseTxnResponse(body);
      break;
    case 6:
      if (auto c = ParseSlotClaim(body); c.ok())
        DUET_CHECK(ParseSlotClaim(EncodeSlotClaim(*c)).ok());
      break;
    default:
      (void)ParseEtcdUrl(body);
      break;
  }
  return 0;
}
