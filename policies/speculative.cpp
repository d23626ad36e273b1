#include "policies/speculative.h"

#include <algorithm>
#include <cstdint>

namespace duet::policies {
namespace {

// SplitMix64's finalizer: a well-mixed 64-bit value from any input.
std::uint64_t Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

int SpeculativeConfig::Accepted(RequestId id, Tokens generated) const {
  std::uint64_t state =
      Mix(static_cast<std::uint64_t>(id) ^ Mix(static_cast<std::uint64_t>(generated)));
  int kept = 0;
  for (int i = 0; i < tokens; ++i) {
    state = Mix(state);
    const double u = static_cast<double>(state >> 11) * 0x1.0p-53;  // uniform in [0, 1)
    if (u >= acceptance[static_cast<std::size_t>(i)]) break;
    ++kept;
  }
  return kept;
}

Tokens DraftTokens(int k, const Request& r) {
  return std::max<Tokens>(0, std::min<Tokens>(k, r.RemainingOutput() - 1));
}

double SpeculativeConfig::MeanAccepted() const {
  double reach = 1, mean = 0;
  for (int i = 0; i < tokens; ++i) {
    reach *= acceptance[static_cast<std::size_t>(i)];
    mean += reach;
  }
  return mean;
}

}  // namespace duet::policies
