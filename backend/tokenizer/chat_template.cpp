// Llama-3 and ChatML prompt rendering (string for string what the official Jinja templates
// produce), format detection and stop tokens.
#include "backend/tokenizer/chat_template.h"

#include <string_view>

#include "backend/tokenizer/unicode_util.h"
#include "common/json_util.h"

namespace duet::backend {
namespace {

// Jinja's `trim` filter (Python's str.strip()): drops leading and trailing whitespace as
// str.isspace() defines it. Ill-formed bytes count as non-space.
std::string_view PythonStrip(std::string_view text) {
  std::size_t begin = 0;
  while (begin < text.size()) {
    char32_t cp = 0;
    const std::size_t len = unicode::DecodeUtf8(text, begin, &cp);
    if (len == 0 || !unicode::IsPythonSpace(cp)) break;
    begin += len;
  }
  std::size_t end = text.size();
  while (end > begin) {
    // Find the start of the last character (continuation bytes are 10xxxxxx).
    std::size_t start = end - 1;
    while (start > begin && end - start < 4 &&
           (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
      --start;
    }
    char32_t cp = 0;
    const std::size_t len = unicode::DecodeUtf8(text, start, &cp);
    if (len != end - start || !unicode::IsPythonSpace(cp)) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

}  // namespace

std::string ApplyChatTemplate(ChatFormat format, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt) {
  std::string out;
  switch (format) {
    case ChatFormat::kLlama3:
      // {% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' +
      //    message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set
      //    content = bos_token + content %}{% endif %}
      for (std::size_t i = 0; i < messages.size(); ++i) {
        if (i == 0) out += "<|begin_of_text|>";
        out += "<|start_header_id|>";
        out += messages[i].role;
        out += "<|end_header_id|>\n\n";
        out += PythonStrip(messages[i].content);
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatFormat::kChatMl:
      for (const ChatMessage& message : messages) {
        out += "<|im_start|>";
        out += message.role;
        out += "\n";
        out += message.content;
        out += "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
  }
  return out;
}

Result<ChatFormat> DetectChatFormatFromTemplate(const std::string& chat_template) {
  if (chat_template.find("<|start_header_id|>") != std::string::npos) return ChatFormat::kLlama3;
  if (chat_template.find("<|im_start|>") != std::string::npos) return ChatFormat::kChatMl;
  return Status::Error(
      "chat_template: neither Llama-3 (<|start_header_id|>) nor ChatML (<|im_start|>); "
      "Duet supports only those two chat formats");
}

Result<ChatFormat> DetectChatFormat(const Tokenizer& tokenizer) {
  auto has = [&](const char* token) { return tokenizer.TokenToId(token).has_value(); };
  if (has("<|start_header_id|>") && has("<|end_header_id|>") && has("<|eot_id|>")) {
    return ChatFormat::kLlama3;
  }
  if (has("<|im_start|>") && has("<|im_end|>")) return ChatFormat::kChatMl;
  return Status::Error(tokenizer.source_name() +
                       ": has neither the Llama-3 chat tokens (<|start_header_id|>, "
                       "<|end_header_id|>, <|eot_id|>) nor ChatML's (<|im_start|>, <|im_end|>)");
}

Result<ChatFormat> DetectChatFormat(const Tokenizer& tokenizer,
                                    const std::string& tokenizer_config_path) {
  if (!tokenizer_config_path.empty()) {
    auto config = ReadJsonFile(tokenizer_config_path);
    if (!config) return config.status();
    if (config->contains("chat_template") && (*config)["chat_template"].is_string())
      return DetectChatFormatFromTemplate((*config)["chat_template"].get<std::string>());
  }
  return DetectChatFormat(tokenizer);
}

std::vector<std::string> StopTokens(ChatFormat format) {
  switch (format) {
    case ChatFormat::kLlama3:
      return {"<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"};
    case ChatFormat::kChatMl:
      return {"<|im_end|>", "<|endoftext|>"};
  }
  return {};
}

std::vector<std::int32_t> StopTokenIds(ChatFormat format, const Tokenizer& tokenizer) {
  std::vector<std::int32_t> ids;
  for (const std::string& token : StopTokens(format)) {
    if (auto id = tokenizer.TokenToId(token)) ids.push_back(*id);
  }
  return ids;
}

const char* ChatFormatName(ChatFormat format) {
  switch (format) {
    case ChatFormat::kLlama3:
      return "llama3";
    case ChatFormat::kChatMl:
      return "chatml";
  }
  return "unknown";
}

}  // namespace duet::backend
