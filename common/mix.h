// SplitMix64's finaliser: a bijective, well-mixed 64-bit hash step (Steele, Lea and Flood,
// "Fast splittable pseudorandom number generators", 2014). The one mix behind Duet's prefix
// block hashes, synthetic prompt tokens and counter-based sampling.
#pragma once

#include <cstdint>

namespace duet {

constexpr std::uint64_t SplitMix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace duet
