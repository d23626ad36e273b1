// Chat prompt formats: renders a conversation exactly as the official Llama-3 and ChatML
// Jinja templates do (without a Jinja engine), detects which format a tokenizer speaks, and
// names each format's stop tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/tokenizer/tokenizer.h"
#include "common/status.h"

namespace duet::backend {

enum class ChatFormat {
  // Meta-Llama-3-*-Instruct's template: <|begin_of_text|>, then per message
  // <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> with CONTENT trimmed of
  // surrounding whitespace. Llama-3.1's template differs: it always writes a system message
  // that starts with "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
  // (and tool definitions); callers wanting that pass the text as the system message.
  kLlama3,
  // Plain ChatML: <|im_start|>ROLE\nCONTENT<|im_end|>\n per message, content untouched.
  // Qwen2's template is the same except that it adds a default system message ("You are a
  // helpful assistant."; Qwen2.5: "You are Qwen, created by Alibaba Cloud. ...") when the
  // conversation has none; pass it explicitly to reproduce that.
  kChatMl,
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

// The prompt text. With `add_generation_prompt` it ends with the header that opens the
// assistant's turn. The Llama-3 text already holds <|begin_of_text|>: encode it with
// add_bos = false. Special tokens in message content are not escaped (as in the Jinja
// templates); encode user content with SpecialTokens::kAsText to keep it from injecting them.
std::string ApplyChatTemplate(ChatFormat format, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt);

// Format from a tokenizer_config.json "chat_template" string: Llama-3 when it writes
// <|start_header_id|>, ChatML when it writes <|im_start|>; an error otherwise.
Result<ChatFormat> DetectChatFormatFromTemplate(const std::string& chat_template);

// Format from the special tokens a tokenizer has: Llama-3 when it has <|start_header_id|>,
// <|end_header_id|> and <|eot_id|>, else ChatML when it has <|im_start|> and <|im_end|>. The
// project's test tokenizer has both sets and is reported as Llama-3.
Result<ChatFormat> DetectChatFormat(const Tokenizer& tokenizer);

// The format a model directory declares, as `duet generate --chat` and `duet serve` both use
// it: the "chat_template" of its tokenizer_config.json (empty path: none) when there is one,
// else what the tokenizer's special tokens say.
Result<ChatFormat> DetectChatFormat(const Tokenizer& tokenizer,
                                    const std::string& tokenizer_config_path);

// Tokens that end the assistant's turn (Llama-3: <|eot_id|>, <|end_of_text|>; Llama-3.1 also
// emits <|eom_id|>; ChatML: <|im_end|>, <|endoftext|>), and the ids of those the tokenizer has.
std::vector<std::string> StopTokens(ChatFormat format);
std::vector<std::int32_t> StopTokenIds(ChatFormat format, const Tokenizer& tokenizer);

const char* ChatFormatName(ChatFormat format);

}  // namespace duet::backend
