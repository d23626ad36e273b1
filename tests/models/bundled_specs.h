// The bundled model and GPU descriptions (models/specs/NAME.json, models/hardware/NAME.json),
// loaded for tests; a file that fails to load fails the test and gives an empty spec.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "models/model_spec.h"

namespace duet::models {

inline ModelSpec Model(const std::string& name) {
  Result<ModelSpec> spec = LoadModelSpec("models/specs/" + name + ".json");
  EXPECT_TRUE(spec.ok()) << spec.error();
  return spec.ok() ? *spec : ModelSpec{};
}

inline HardwareSpec Gpu(const std::string& name) {
  Result<HardwareSpec> hw = LoadHardwareSpec("models/hardware/" + name + ".json");
  EXPECT_TRUE(hw.ok()) << hw.error();
  return hw.ok() ? *hw : HardwareSpec{};
}

}  // namespace duet::models
