// The other process of the CUDA IPC transport's cross-process test
// (cuda_ipc_transport_test.cpp): allocates a KV region of BLOCKS blocks of BLOCK_BYTES bytes
// on device 0, byte i contract::PatternByte(i, SEED) as in the contract's regions, makes a CUDA IPC
// transport over it, prints its descriptor (hex) on one line, and waits to be killed. Usage:
// duet_cuda_ipc_peer BLOCK_BYTES BLOCKS SEED   (exit 2 without a device)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/cuda_ipc_kv_transport.h"
#include "kernels/cuda/device_buffer.h"
#include "tests/transport/kv_transport_contract.h"

int main(int argc, char** argv) {
  using namespace duet;
  if (argc != 4) return 2;
  const long long block_bytes = std::atoll(argv[1]), blocks = std::atoll(argv[2]);
  const unsigned seed = static_cast<unsigned>(std::atoi(argv[3]));
  if (block_bytes <= 0 || blocks <= 0 || kernels::cuda::DeviceCount() == 0) return 2;
  std::vector<unsigned char> bytes(static_cast<std::size_t>(block_bytes * blocks));
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = duet::backend::contract::PatternByte(i, seed);
  kernels::cuda::DeviceBuffer<unsigned char> region(bytes);
  auto t = backend::CudaIpcKvTransport::Create(0, {region.get(), block_bytes, blocks, nullptr});
  if (!t.ok()) {
    std::fprintf(stderr, "duet_cuda_ipc_peer: %s\n", t.error().c_str());
    return 1;
  }
  for (unsigned char c : (*t)->Descriptor()) std::printf("%02x", c);
  std::printf("\n");
  std::fflush(stdout);
  while (true) pause();
}
