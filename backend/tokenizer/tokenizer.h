// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2, Llama-3, Qwen2
// and the project's own test tokenizer): encoding that matches HF `tokenizers` token for
// token, decoding, and streaming (incremental) decoding that never splits a UTF-8 character.
//
// What is supported (anything else is rejected at load time with an error naming the field):
//   normalizer      null, NFC, or a Sequence of those
//   pre_tokenizer   null, ByteLevel (use_regex: the GPT-2 regex; add_prefix_space), Split
//                   (Regex or String pattern, any behavior, invert), or a Sequence of those
//                   with ByteLevel (if any) last
//   model           BPE: vocab, merges ("a b" strings or ["a", "b"] pairs), ignore_merges,
//                   unk_token, fuse_unk, byte_fallback; no dropout or subword affixes
//   post_processor  null, ByteLevel (a no-op for ids), TemplateProcessing, or a Sequence
//   decoder         ByteLevel
// Differences from HF `tokenizers`, all outside what GPT-2/Llama-3/Qwen2 files use: added
// tokens are all matched on the raw text (HF matches "normalized": true ones after the
// normalizer; only differs when normalization changes an added token's text); `single_word`
// treats every non-ASCII non-space character as a word character; NFC uses Unicode 14 tables;
// added-token ids are taken from the file as written (HF re-numbers them after the model
// vocabulary and only warns when the file disagrees); regexes run on PCRE2 rather than
// Oniguruma (same Unicode classes for these patterns; the empty-match stepping is copied).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace duet::backend {

namespace internal {
struct TokenizerData;  // defined in tokenizer.cpp
}  // namespace internal

// How Encode treats added tokens flagged "special" when their text appears in the input.
enum class SpecialTokens {
  kParse,   // matched literally and emitted as their ids (HF's default)
  kAsText,  // tokenized like any other text (HF's encode_special_tokens = True), so user
            // text can never inject control tokens; non-special added tokens still match
};

class Tokenizer {
 public:
  // `source_name` (usually the file path) prefixes every error message.
  static Result<Tokenizer> FromJson(const std::string& json_text, const std::string& source_name);
  static Result<Tokenizer> Load(const std::string& path);

  // Token ids for `text`: added tokens are matched first (leftmost, then longest), the text
  // between them is normalized, pre-tokenized and BPE-encoded. With `add_bos` the
  // post-processor's single-sequence template is applied (Llama-3: <|begin_of_text|> in
  // front; HF's add_special_tokens=True). Chat-templated text already starts with the BOS
  // token, so encode it with add_bos = false. Text need not be valid UTF-8: ill-formed bytes
  // are encoded as their byte tokens (HF cannot take such input at all).
  std::vector<std::int32_t> Encode(std::string_view text, bool add_bos = false,
                                   SpecialTokens special = SpecialTokens::kParse) const;

  // The text of `ids` (HF's decode). Ids that name no token (out of range, or a gap in the
  // vocabulary) decode to U+FFFD instead of failing: a model whose embedding table is padded
  // beyond the tokenizer can sample them, and a stream must go on. (HF drops them silently.)
  // Bytes that do not form valid UTF-8 become U+FFFD, one per maximal ill-formed subpart.
  std::string Decode(std::span<const std::int32_t> ids, bool skip_special_tokens = false) const;

  // One past the largest token id (model vocabulary and added tokens together).
  std::int32_t vocab_size() const;
  // The first id the post-processor puts in front of a single sequence, if any (Llama-3:
  // <|begin_of_text|>; Qwen2 and GPT-2: none).
  std::optional<std::int32_t> bos_token_id() const;
  // Id of an added token's content or of a model vocabulary entry (byte-level form, e.g. "Ġthe").
  std::optional<std::int32_t> TokenToId(std::string_view token) const;
  // The token string of `id` (added-token content or vocabulary entry), empty when none.
  std::string_view IdToToken(std::int32_t id) const;
  bool IsSpecial(std::int32_t id) const;
  // The raw bytes `id` decodes to (possibly part of a UTF-8 character); empty when none.
  std::string_view TokenBytes(std::int32_t id) const;
  const std::string& source_name() const;

 private:
  friend class IncrementalDecoder;
  explicit Tokenizer(std::shared_ptr<const internal::TokenizerData> data)
      : impl_(std::move(data)) {}
  std::shared_ptr<const internal::TokenizerData> impl_;  // immutable once loaded; shared by copies
};

// Streaming detokenizer: Push returns the text that became complete with this token, holding
// back the bytes of a UTF-8 character that later tokens may finish. Every returned piece is
// valid UTF-8, and the pieces of Push* + Flush concatenate to Decode(all ids). Keeps its own
// reference to the tokenizer's data, so it may outlive the Tokenizer it was made from.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  std::string Push(std::int32_t id);
  // Emits what is still held back (an unfinished character becomes U+FFFD) and resets.
  std::string Flush();
  // Bytes currently held back waiting for the rest of a character (at most 3).
  std::size_t pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace duet::backend
