// Fuzz target for the tokenizer.json loader and everything a loaded tokenizer does: bytes are
// parsed as tokenizer.json; when they load, a fixed string and the input itself (first 4 KB)
// are encoded both with special tokens parsed and as text, then decoded in one go and
// streamed. Ids must be in range, decoded text valid UTF-8, streaming equal to Decode.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/tokenizer/tokenizer.h"
#include "backend/tokenizer/unicode_util.h"
#include "common/status.h"

namespace {

using duet::backend::IncrementalDecoder;
using duet::backend::SpecialTokens;
using duet::backend::Tokenizer;

constexpr std::size_t kMaxEncodeBytes = 4096;

void CheckRoundTrip(const Tokenizer& tokenizer, std::string_view text) {
  for (SpecialTokens mode : {SpecialTokens::kParse, SpecialTokens::kAsText}) {
    const std::vector<std::int32_t> ids = tokenizer.Encode(text, /*add_bos=*/true, mode);
    for (std::int32_t id : ids) DUET_CHECK(id >= 0 && id < tokenizer.vocab_size());
    for (bool skip : {false, true}) {
      const std::string decoded = tokenizer.Decode(ids, skip);
      DUET_CHECK(duet::backend::unicode::IsValidUtf8(decoded));
      IncrementalDecoder stream(tokenizer, skip);
      std::string streamed;
      for (std::int32_t id : ids) {
        const std::string piece = stream.Push(id);
        DUET_CHECK(duet::backend::unicode::IsValidUtf8(piece));
        streamed += piece;
      }
      streamed += stream.Flush();
      DUET_CHECK(streamed == decoded);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  duet::Result<Tokenizer> tokenizer = Tokenizer::FromJson(input, "fuzz.json");
  if (!tokenizer.ok()) {
    DUET_CHECK(tokenizer.error().rfind("fuzz.json: ", 0) == 0);  // every error names the file
    return 0;
  }
  CheckRoundTrip(*tokenizer, "Hello, world! It's 12345 caf\u00e9 \U0001F642 <|eot_id|>\n\n  x");
  CheckRoundTrip(*tokenizer, std::string_view(input).substr(0, kMaxEncodeBytes));
  return 0;
}
