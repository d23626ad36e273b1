// The `duet` subcommands and the exit convention they share: 0 success, 1 bad input files or a
// failed run, 2 a bad command line; errors go to stderr as one "duet: error: ..." line.
#pragma once

#include <string>

namespace duet::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

int Fail(const std::string& message, int code = kExitError);

int Simulate(int argc, char** argv);       // cli/main.cpp
int MakeTestModel(int argc, char** argv);  // cli/generate.cpp
int Generate(int argc, char** argv);       // cli/generate.cpp

}  // namespace duet::cli
