// Fuzz target for decoding with the project's test tokenizer: the input is read as little-
// endian 16-bit token ids (some out of range) and streamed through IncrementalDecoder, which
// must return valid UTF-8 at every step and add up to Decode; the input is also encoded as
// raw text, whose token bytes must give the input back exactly.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/tokenizer/test_tokenizer.h"
#include "backend/tokenizer/tokenizer.h"
#include "backend/tokenizer/unicode_util.h"
#include "common/status.h"

namespace {

using duet::backend::IncrementalDecoder;
using duet::backend::SpecialTokens;
using duet::backend::Tokenizer;
namespace unicode = duet::backend::unicode;

const Tokenizer& TestTokenizer() {
  static const Tokenizer tokenizer = [] {
    duet::Result<Tokenizer> t =
        Tokenizer::FromJson(duet::backend::MakeTestTokenizerJson(300), "test");
    DUET_CHECK_MSG(t.ok(), t.error());
    return *t;
  }();
  return tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Tokenizer& tokenizer = TestTokenizer();
  std::vector<std::int32_t> ids;
  for (std::size_t i = 0; i + 1 < size; i += 2) {
    // Ids a little beyond both ends of the vocabulary, to exercise the bad-id path.
    const int raw = data[i] | (data[i + 1] << 8);
    ids.push_back(raw % (tokenizer.vocab_size() + 8) - 4);
  }
  for (bool skip : {false, true}) {
    IncrementalDecoder stream(tokenizer, skip);
    std::string streamed;
    for (std::int32_t id : ids) {
      const std::string piece = stream.Push(id);
      DUET_CHECK(unicode::IsValidUtf8(piece));
      DUET_CHECK(stream.pending_bytes() <= 3);
      streamed += piece;
    }
    streamed += stream.Flush();
    const std::string decoded = tokenizer.Decode(ids, skip);
    DUET_CHECK(streamed == decoded);
    // Decoded text is valid UTF-8, and this tokenizer is lossless on it.
    DUET_CHECK(tokenizer.Decode(tokenizer.Encode(decoded)) == decoded);
  }

  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string bytes;
  for (std::int32_t id : tokenizer.Encode(text, false, SpecialTokens::kAsText)) {
    bytes += tokenizer.TokenBytes(id);
  }
  DUET_CHECK(bytes == text);
  return 0;
}
