// The command line a CLI fuzz target hands to a parser: the input's lines are the arguments after
// `command` (at most 64; NUL bytes dropped, as argv strings cannot hold them), and argv points
// into them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct FuzzCommandLine {
  std::vector<std::string> args;
  std::vector<char*> argv;  // args' strings, then nullptr

  FuzzCommandLine(const char* command, const std::uint8_t* data, std::size_t size) {
    args.push_back(command);
    std::string current;
    for (std::size_t i = 0; i < size && args.size() < 64; ++i) {
      const char c = static_cast<char>(data[i]);
      if (c == '\n') {
        args.push_back(current);
        current.clear();
      } else if (c != '\0') {
        current += c;
      }
    }
    if (!current.empty()) args.push_back(current);
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
  }
  int argc() const { return static_cast<int>(args.size()); }
};
