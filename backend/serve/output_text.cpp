// Incremental detokenization with stop strings: the decoder releases whole UTF-8 characters,
// the matcher releases what can no longer be part of a stop string.
#include "backend/serve/output_text.h"

#include <algorithm>

namespace duet::backend::serve {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  // Empty stop strings would match everywhere; the protocol layer refuses them.
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopStringMatcher::Push(std::string_view text) {
  if (matched_) return {};
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, {});
  // held_ is at most the longest stop string plus the new text, so a full search is cheap.
  std::size_t earliest = std::string::npos;
  for (const std::string& stop : stops_) earliest = std::min(earliest, held_.find(stop));
  if (earliest != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, earliest);
    held_.clear();
    return out;
  }
  // The longest tail of held_ that some stop string begins with. It starts on a character
  // boundary: a stop string is valid UTF-8, so it cannot begin with a continuation byte.
  std::size_t keep = 0;
  for (const std::string& stop : stops_) {
    for (std::size_t n = std::min(stop.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, stop, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::Flush() {
  if (matched_) return {};
  return std::exchange(held_, {});
}

OutputText::OutputText(const Tokenizer& tokenizer, std::vector<std::string> stops,
                       bool skip_special_tokens)
    : decoder_(tokenizer, skip_special_tokens), matcher_(std::move(stops)) {}

std::string OutputText::Push(std::int32_t token) {
  if (matcher_.matched()) return {};
  ++counted_tokens_;
  return matcher_.Push(decoder_.Push(token));
}

std::string OutputText::Finish() {
  if (matcher_.matched()) return {};
  std::string out = matcher_.Push(decoder_.Flush());
  return out + matcher_.Flush();
}

}  // namespace duet::backend::serve
