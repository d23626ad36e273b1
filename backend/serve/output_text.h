// A request's generated text as the client sees it: token ids detokenized incrementally (a
// UTF-8 character is never split across chunks), stop strings matched on the decoded text
// across token boundaries (the match and everything after it are dropped), and text that
// could still become the start of a stop string held back until it cannot. Not thread-safe:
// one request's tokens, in order, from one thread (the connection's strand).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/tokenizer/tokenizer.h"

namespace duet::backend::serve {

// Stop-string matching over a stream of text pieces.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Appends `text` and returns what can be released now: everything before the earliest
  // match (then matched() is true and every later call returns ""), or everything except the
  // longest tail that is a proper prefix of some stop string.
  std::string Push(std::string_view text);
  // The end of the stream: releases the held-back tail ("" once matched).
  std::string Flush();
  bool matched() const { return matched_; }
  // Bytes held back now (a possible start of a stop string).
  std::size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
};

// Token ids in, client text out.
class OutputText {
 public:
  OutputText(const Tokenizer& tokenizer, std::vector<std::string> stops, bool skip_special_tokens);

  // Adds the next generated token; returns the text released by it (often "", never a part
  // of a UTF-8 character). After stopped() the token is ignored (not counted).
  std::string Push(std::int32_t token);
  // The end of generation (not by a stop string): the rest of the text.
  std::string Finish();
  // A stop string matched: the request is over, its text ends before the match.
  bool stopped() const { return matcher_.matched(); }
  // Tokens pushed up to and including the one that completed the stop string (all of them
  // when none matched): the completion's token count as the client is told it.
  std::int64_t counted_tokens() const { return counted_tokens_; }

 private:
  IncrementalDecoder decoder_;
  StopStringMatcher matcher_;
  std::int64_t counted_tokens_ = 0;
};

}  // namespace duet::backend::serve
