// A small byte-level BPE tokenizer the project makes itself, for the test model: its
// tokenizer.json is written by WriteTestModel (backend/model) and loads in Hugging Face
// `tokenizers` as well as in Duet's own tokenizer.
#pragma once

#include <string>

namespace duet::backend {

// tokenizer.json text (Hugging Face format): GPT-2 style byte-level BPE with the Llama-3
// pre-tokenization regex, 256 byte tokens plus merges learned deterministically from a
// built-in English corpus until the vocabulary holds `vocab_size` tokens, then the Llama-3
// special tokens (<|begin_of_text|>, <|end_of_text|>, <|start_header_id|>,
// <|end_header_id|>, <|eot_id|>) and ChatML's <|im_start|>, <|im_end|> as added tokens with
// the ids that follow. vocab_size must be at least 256.
std::string MakeTestTokenizerJson(int vocab_size);

}  // namespace duet::backend
