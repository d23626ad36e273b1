// Fuzz target: the CUDA IPC KV descriptor a peer relays (backend/transport/cuda_ipc_descriptor.h).
// Any input is parsed or rejected with an error, never a crash; what parses re-encodes to the
// same bytes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "backend/transport/cuda_ipc_descriptor.h"
#include "common/status.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto parsed = duet::backend::ParseCudaIpcDescriptor(bytes);
  if (parsed.ok()) DUET_CHECK(duet::backend::EncodeCudaIpcDescriptor(*parsed) == bytes);
  return 0;
}
