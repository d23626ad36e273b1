// MakeTestTokenizerJson: trains a small byte-level BPE deterministically (Llama-3 regex
// pre-tokenization, most frequent pair first, ties to the smallest ids) over a built-in
// corpus and writes it as a Hugging Face tokenizer.json shaped like Llama-3's.
#include "backend/tokenizer/test_tokenizer.h"

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/tokenizer/regex.h"
#include "backend/tokenizer/unicode_util.h"
#include "common/status.h"

namespace duet::backend {
namespace {

constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kSpecialTokens[] = {
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eot_id|>",        "<|im_start|>",    "<|im_end|>",
};

// Varied text so the merges cover common English words, numbers, code, punctuation and a
// little non-ASCII. Changing it changes every test tokenizer (and the committed fixtures).
constexpr const char* kCorpus =
    R"(The quick brown fox jumps over the lazy dog. The dog was not amused.
It's a truth universally acknowledged that a single model in possession of a good tokenizer
must be in want of a fast decoder. Don't worry: we'll test it, and they've said it works.
I'm sure you'd agree that there's more to serving than prefill and decode, isn't there?

Prefill processes the whole prompt at once; decode produces one token at a time. When the two
phases share a GPU, long prompts stall the streams of tokens that other users are waiting for.
Disaggregated serving puts them on different instances and moves the key-value cache between
them. The scheduler decides where each request goes, how large each batch is, and when to
transfer the cache. Time to first token (TTFT) and time per output token (TPOT) are the two
service-level objectives we watch; the 99th percentile matters more than the mean.

Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1024 2048 4096 65536 3.14159 2.71828
1,000,000 requests per day is about 11.57 requests per second. In 2024 the price was $2.50,
in 2025 it rose by 12% to $2.80. Call 555-0123 or write to team@example.com before 17:30.
Version 1.0.3 was released on 2023-11-05; version 2.1 followed on 2024-06-30.

def encode(text, vocab):
    """Split text into tokens and look each one up."""
    tokens = []
    for word in text.split():
        if word in vocab:
            tokens.append(vocab[word])
        else:
            tokens.extend(vocab.get(ch, 0) for ch in word)
    return tokens

for (int i = 0; i < n; ++i) { sum += x[i] * w[i]; }  // dot product
if (a != b && c >= d) return {"ok": true, "value": [1, 2, 3]};

Some words from other languages: café, naïve, résumé, façade, coöperate, jalapeño, Zürich,
São Paulo, Kraków, Ελληνικά, русский язык, 日本, 日本語, 東京, 中文, 한국어, and an emoji 🙂
or two 🚀. Smart quotes “like these” and ‘these’ — plus an ellipsis… and a bullet • item.

Questions? Answers! Exclamations!!! Parentheses (like this) and [brackets] and {braces}.
Ampersands & pipes | and slashes / \ and the tilde ~ and caret ^ and percent % signs.
A line with    several     spaces	and	tabs.
Trailing spaces at the end of this line   
    Indented line with four spaces.

Once upon a time, in a data center far away, there lived a cluster of eight GPUs. Every
morning the GPUs woke up, loaded their weights, and waited for requests. Some requests were
short and some were long; some users were patient and others were not. The wise scheduler
learned to keep the short requests moving while the long ones were prefilled elsewhere.
"What is the capital of France?" asked the user. "Paris," answered the model, "and the
capital of Japan is Tokyo." The user asked again, and again, and again, until the cache
was warm and every answer came back in less than fifty milliseconds.

Lists:
- first item
- second item
- third item
1. one
2. two
3. three

The end. THE END. the end? The End!
)";

// Counts a pair key made of two ids.
std::uint64_t Key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
         static_cast<std::uint32_t>(b);
}

// The corpus split the way the tokenizer's Split(Llama-3 regex, Isolated) step splits text:
// every match and every gap between matches is a word.
std::map<std::string, std::int64_t> CountWords() {
  Result<Regex> regex = Regex::Compile(kLlama3Regex);
  DUET_CHECK_MSG(regex.ok(), regex.error());
  const std::string_view corpus(kCorpus);
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  regex->FindAll(corpus, &matches);
  std::map<std::string, std::int64_t> counts;
  std::size_t prev = 0;
  for (const auto& [start, end] : matches) {
    if (start > prev) ++counts[std::string(corpus.substr(prev, start - prev))];
    if (end > start) ++counts[std::string(corpus.substr(start, end - start))];
    prev = end;
  }
  if (prev < corpus.size()) ++counts[std::string(corpus.substr(prev))];
  return counts;
}

}  // namespace

std::string MakeTestTokenizerJson(int vocab_size) {
  DUET_CHECK_MSG(vocab_size >= 256, "test tokenizer vocab_size must be at least 256");
  const auto& alphabet = unicode::ByteLevelAlphabet();

  std::vector<std::string> tokens(alphabet.begin(), alphabet.end());  // id b = byte b
  std::unordered_map<std::string, std::int32_t> token_ids;
  for (std::int32_t b = 0; b < 256; ++b) token_ids.emplace(tokens[b], b);
  std::vector<std::pair<std::int32_t, std::int32_t>> merges;

  struct Word {
    std::vector<std::int32_t> symbols;
    std::int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [text, count] : CountWords()) {
    Word word{{}, count};
    for (char c : text) word.symbols.push_back(static_cast<unsigned char>(c));
    words.push_back(std::move(word));
  }

  // Adds a merge; the vocabulary grows only when the merged string is new (two pairs can
  // spell the same token, as in HF's trainer).
  auto add_merge = [&](std::int32_t a, std::int32_t b) {
    merges.emplace_back(a, b);
    const std::string merged = tokens[a] + tokens[b];
    if (token_ids.emplace(merged, static_cast<std::int32_t>(tokens.size())).second) {
      tokens.push_back(merged);
    }
    return token_ids.at(merged);
  };

  // Phase 1: learn merges from the corpus, most frequent pair first, until the vocabulary is
  // full or every word is a single token.
  while (static_cast<int>(tokens.size()) < vocab_size) {
    std::unordered_map<std::uint64_t, std::int64_t> pair_counts;
    for (const Word& word : words) {
      for (std::size_t i = 0; i + 1 < word.symbols.size(); ++i) {
        pair_counts[Key(word.symbols[i], word.symbols[i + 1])] += word.count;
      }
    }
    if (pair_counts.empty()) break;
    // Highest count; ties go to the smallest key, so hash order never matters.
    std::uint64_t best_key = 0;
    std::int64_t best_count = -1;
    for (const auto& [key, count] : pair_counts) {
      if (count > best_count || (count == best_count && key < best_key)) {
        best_key = key;
        best_count = count;
      }
    }
    const auto a = static_cast<std::int32_t>(best_key >> 32);
    const auto b = static_cast<std::int32_t>(best_key & 0xFFFFFFFFu);
    const std::int32_t merged = add_merge(a, b);
    for (Word& word : words) {
      std::vector<std::int32_t> out;
      out.reserve(word.symbols.size());
      for (std::size_t i = 0; i < word.symbols.size(); ++i) {
        if (i + 1 < word.symbols.size() && word.symbols[i] == a && word.symbols[i + 1] == b) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(word.symbols[i]);
        }
      }
      word.symbols = std::move(out);
    }
  }
  // Phase 2 (only for vocabularies larger than the corpus supports): token + byte merges in
  // id order, so the requested size is always reached.
  for (std::int32_t a = 0; static_cast<int>(tokens.size()) < vocab_size; ++a) {
    for (std::int32_t b = 0; b < 256 && static_cast<int>(tokens.size()) < vocab_size; ++b) {
      if (!token_ids.contains(tokens[a] + tokens[b])) add_merge(a, b);
    }
  }

  using OrderedJson = nlohmann::ordered_json;
  OrderedJson added = OrderedJson::array();
  std::int32_t next_id = vocab_size;
  for (const char* content : kSpecialTokens) {
    added.push_back({{"id", next_id++},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  OrderedJson vocab = OrderedJson::object();
  for (std::size_t id = 0; id < tokens.size(); ++id) vocab[tokens[id]] = id;
  OrderedJson merge_list = OrderedJson::array();
  // The legacy "left right" form loads in every tokenizers release (byte-level tokens never
  // contain a space).
  for (const auto& [a, b] : merges) merge_list.push_back(tokens[a] + " " + tokens[b]);

  OrderedJson doc;
  doc["version"] = "1.0";
  doc["truncation"] = nullptr;
  doc["padding"] = nullptr;
  doc["added_tokens"] = added;
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", OrderedJson::array({{{"type", "Split"},
                                             {"pattern", {{"Regex", kLlama3Regex}}},
                                             {"behavior", "Isolated"},
                                             {"invert", false}},
                                            {{"type", "ByteLevel"},
                                             {"add_prefix_space", false},
                                             {"trim_offsets", true},
                                             {"use_regex", false}}})}};
  const std::string bos = kSpecialTokens[0];
  const std::int32_t bos_id = vocab_size;
  doc["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       OrderedJson::array(
           {{{"type", "ByteLevel"},
             {"add_prefix_space", true},
             {"trim_offsets", false},
             {"use_regex", true}},
            {{"type", "TemplateProcessing"},
             {"single", OrderedJson::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
             {"pair", OrderedJson::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                          {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                                          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
             {"special_tokens",
              {{bos,
                {{"id", bos},
                 {"ids", OrderedJson::array({bos_id})},
                 {"tokens", OrderedJson::array({bos})}}}}}}})}};
  doc["decoder"] = {{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", true},
                    {"use_regex", true}};
  doc["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", true},
                  {"vocab", vocab},
                  {"merges", merge_list}};
  return doc.dump(2) + "\n";
}

}  // namespace duet::backend
