// Helpers shared by the tokenizer tests: fixture paths, file reading, and loading the
// committed test tokenizer.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "backend/tokenizer/tokenizer.h"

namespace duet::backend::testing {

inline std::string FixturePath(const std::string& name) {
  return std::string(DUET_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + name;
}

// The whole file, or "" when it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The vocabulary size of the committed test tokenizer (tests/fixtures/tokenizer/).
inline constexpr int kFixtureVocabSize = 512;

}  // namespace duet::backend::testing
