// PCRE2 wrapper for pre-tokenization: compiles a tokenizer.json "Regex" pattern (UTF, Unicode
// properties, JIT when available) and lists its matches the way Hugging Face `tokenizers`
// (Oniguruma's find_iter) does, so the pieces between and around matches agree with it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace duet::backend {

class Regex {
 public:
  // On error: PCRE2's own message and the offset in the pattern ("... at offset 11").
  static Result<Regex> Compile(std::string_view pattern);

  // Appends the [start, end) byte ranges of the successive non-overlapping matches in `text`.
  // An empty match right where the previous match ended is skipped (the search moves one
  // character on), as Oniguruma's iterator does. Ill-formed UTF-8 never matches; it ends up
  // between matches. If PCRE2 gives up (match limit), the rest of the text has no matches.
  void FindAll(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>* out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;  // compiled pattern, shared by copies (matching is const)
  std::string pattern_;
};

}  // namespace duet::backend
