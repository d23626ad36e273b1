// Fuzz target for `duet serve`'s request parser (backend/serve/openai_protocol.h): any bytes as
// a completions and as a chat-completions body must give parameters or a 4xx error with a
// message, never a crash; accepted parameters hold their documented bounds. Their stop strings
// then cut the prompt text fed in pieces: what the matcher releases is always a prefix of the
// input, and all of it when nothing matched.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "backend/serve/openai_protocol.h"
#include "backend/serve/output_text.h"

using namespace duet::backend::serve;

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckParams(const GenerationParams& p) {
  Check(p.temperature >= 0 && p.temperature <= 2);
  Check(p.top_p > 0 && p.top_p <= 1);
  Check(p.top_k >= 0);
  Check(!p.max_tokens || *p.max_tokens >= 1);
  Check(p.stop.size() <= kMaxStopStrings);
  for (const auto& s : p.stop) Check(!s.empty() && s.size() <= kMaxStopStringBytes);
  if (p.endpoint == Endpoint::kCompletions) {
    Check(p.prompt_text.has_value() != !p.prompt_ids.empty());
    Check(p.messages.empty());
  } else {
    Check(!p.messages.empty() && !p.prompt_text && p.prompt_ids.empty());
  }
}

void FeedStops(const GenerationParams& p, std::string_view text, std::size_t piece) {
  StopStringMatcher m(p.stop);
  std::string out;
  for (std::size_t i = 0; i < text.size(); i += piece) out += m.Push(text.substr(i, piece));
  out += m.Flush();
  Check(text.substr(0, out.size()) == out);
  if (!m.matched()) Check(out == text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    GenerationParams params;
    if (auto error = ParseGenerationBody(endpoint, body, &params)) {
      Check(error->http_status >= 400 && error->http_status < 500);
      Check(!error->message.empty());
      Check(!ErrorBody(*error).empty());
      continue;
    }
    CheckParams(params);
    if (params.prompt_text) {
      FeedStops(params, *params.prompt_text, 1 + size % 7);
    } else if (!params.messages.empty()) {
      FeedStops(params, params.messages.front().content, 1 + size % 5);
    }
  }
  return 0;
}
