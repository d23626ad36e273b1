// Starting and polling SimGrid communications, for the ports that post them (KV transfers,
// tier I/O).
#pragma once

#include <simgrid/s4u.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace duet::sim {

// Starts moving `bytes` from `src` to `dst` now (a simulation also counts them per link).
using StartComm = std::function<simgrid::s4u::CommPtr(
    simgrid::s4u::Host* src, simgrid::s4u::Host* dst, std::uint64_t bytes)>;

// The bytes each of `shards` parallel communications moves of `bytes` (TP shards).
inline std::uint64_t ShardBytes(std::int64_t bytes, std::size_t shards) {
  return static_cast<std::uint64_t>(
      std::ceil(static_cast<double>(bytes) / static_cast<double>(shards)));
}

// Drops the communications of `comms` that finished. Returns why one failed (a link on its
// route turned off), or empty. A failed one is not tested: SimGrid 3.32 aborts on a test of a
// failed activity.
inline std::string DropFinished(std::vector<simgrid::s4u::CommPtr>& comms) {
  std::string failed;
  try {
    std::erase_if(comms, [&](const simgrid::s4u::CommPtr& c) {
      if (c->get_state() != simgrid::s4u::Activity::State::FAILED) return c->test();
      failed = "a link on its route failed";
      return true;
    });
  } catch (const simgrid::Exception& e) {
    failed = e.what();
  }
  return failed;
}

}  // namespace duet::sim
