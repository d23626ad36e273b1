// Fuzz target for `duet replay`'s reply parsers (backend/replay/): the SSE parser fed the input
// whole and in pieces (sizes from the first byte) must give the same events or the same error;
// every event goes through the completion-chunk parser; the input is also read as an error
// body, a model list and an endpoint URL (a parsed URL must parse again to itself).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/replay/openai.h"
#include "backend/replay/sse.h"

using namespace duet::backend::replay;

namespace {

constexpr std::size_t kMaxEventBytes = 4096;

bool SameEvents(const std::vector<SseEvent>& a, const std::vector<SseEvent>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].data != b[i].data || a[i].type != b[i].type || a[i].id != b[i].id) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t piece = data[0] % 17 + 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  SseParser whole(kMaxEventBytes);
  std::vector<SseEvent> whole_events;
  const bool whole_ok = whole.Feed(text, whole_events).ok();

  SseParser pieces(kMaxEventBytes);
  std::vector<SseEvent> piece_events;
  bool pieces_ok = true;
  for (std::size_t at = 0; at < text.size() && pieces_ok; at += piece)
    pieces_ok = pieces.Feed(text.substr(at, piece), piece_events).ok();
  if (whole_ok != pieces_ok || !SameEvents(whole_events, piece_events)) __builtin_trap();

  for (const SseEvent& e : whole_events) {
    if (e.data.size() > kMaxEventBytes) __builtin_trap();
    auto chunk = ParseCompletionChunk(e.data);
    if (chunk.ok()) {
      if (chunk->done && (chunk->token_event || !chunk->finish_reason.empty())) __builtin_trap();
      for (const auto& n : {chunk->prompt_tokens, chunk->completion_tokens, chunk->cached_tokens})
        if (n && *n < 0) __builtin_trap();
      if (chunk->duet_queue_ms && !(*chunk->duet_queue_ms >= 0)) __builtin_trap();
      if (chunk->duet_instance && (*chunk->duet_instance < 0 || *chunk->duet_instance > 65535))
        __builtin_trap();
    }
  }

  // At most 80 bytes of the body, each written as at most 4 (an \xNN escape), and "...".
  if (DescribeErrorBody(text, 80).size() > 4 * 80 + 3) __builtin_trap();
  (void)ParseFirstModelId(text);
  auto endpoint = ParseEndpoint(std::string(text));
  if (endpoint.ok()) {
    auto again = ParseEndpoint(endpoint->url);
    if (!again.ok() || again->url != endpoint->url || again->host != endpoint->host ||
        again->port != endpoint->port || again->base_path != endpoint->base_path)
      __builtin_trap();
  }
  return 0;
}
