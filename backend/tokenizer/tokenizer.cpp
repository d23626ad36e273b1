// tokenizer.json loading (every rejection names the file and the field), encoding (added
// tokens, normalizer, pre-tokenizer pipeline, byte-level BPE with a bounded word cache),
// decoding and the streaming IncrementalDecoder.
#include "backend/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "backend/tokenizer/regex.h"
#include "backend/tokenizer/unicode_util.h"
#include "common/json_util.h"

namespace duet::backend {
namespace {

using Json = nlohmann::json;

// Hash that lets unordered maps keyed by std::string be probed with a string_view.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Ids beyond this are refused: real vocabularies stay below 2^18, and the id tables are dense.
constexpr std::int64_t kMaxTokenId = (1 << 24) - 1;
// Word cache bound (HF uses the same capacity); words longer than this many bytes are not
// cached, so the cache holds at most ~kCacheEntries * kCacheMaxWordBytes bytes of keys.
constexpr std::size_t kCacheEntries = 10000;
constexpr std::size_t kCacheMaxWordBytes = 64;

// The GPT-2 pre-tokenization regex that ByteLevel's use_regex applies.
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  bool byte_level = false;
  // Split: a regex or, when regex is empty, a literal string.
  std::optional<Regex> regex;
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // ByteLevel
  bool add_prefix_space = false;
  bool use_regex = false;
};

struct AddedToken {
  std::int32_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
};

struct TrieNode {
  std::vector<std::pair<unsigned char, std::int32_t>> children;
  std::int32_t token = -1;  // index into added tokens when a content ends here
};

struct MergeRule {
  std::int32_t rank;
  std::int32_t merged_id;
};

std::uint64_t PairKey(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) |
         static_cast<std::uint32_t>(right);
}

enum IdFlags : std::uint8_t { kIdExists = 1, kIdAdded = 2, kIdSpecial = 4 };

std::string Quote(std::string_view s) {
  // Keeps messages one line and readable when a token holds control bytes.
  std::string out = "'";
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\x%02x", static_cast<unsigned char>(c));
      out += buffer;
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

}  // namespace

namespace internal {

struct TokenizerData {
  std::string source;

  // Model (BPE).
  StringMap<std::int32_t> vocab;
  std::unordered_map<std::uint64_t, MergeRule> merges;
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  std::optional<std::int32_t> unk_id;
  std::array<std::int32_t, 256> byte_fallback_ids{};  // "<0xAB>" tokens, -1 when absent

  // Added tokens and the byte trie that finds them in text.
  std::vector<AddedToken> added;
  StringMap<std::int32_t> added_by_content;
  std::vector<TrieNode> trie;
  // The root's children by byte (-1: none), so text without added-token starts is scanned
  // with one table lookup per byte however many added tokens there are.
  std::array<std::int32_t, 256> trie_root{};

  bool nfc = false;
  std::vector<PreTokenizerStep> steps;
  bool byte_level = false;  // a ByteLevel pre-tokenizer maps bytes to the GPT-2 alphabet
  std::optional<Regex> gpt2_regex;

  // Post-processor (single-sequence template).
  std::vector<std::int32_t> prefix_ids, suffix_ids;

  // Per-id tables for decoding.
  std::vector<std::string> id_token;
  std::vector<std::string> id_bytes;
  std::vector<std::uint8_t> id_flags;

  // Word cache: byte-level word -> ids. Guarded because Encode is const and may run on
  // several threads; cleared wholesale when full so it follows the current traffic.
  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<std::int32_t>> cache;

  // Encoding.
  struct Scratch {
    std::string word;
    std::vector<std::int32_t> symbols, prev, next;
    std::vector<std::pair<std::size_t, std::size_t>> matches;
    struct Entry {
      std::int32_t rank, pos, left, right;
      bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::vector<Entry> heap;
  };
  void SplitOnAddedTokens(std::string_view text, SpecialTokens mode,
                          const std::function<void(std::string_view, std::int32_t)>& emit) const;
  void EncodeSegment(std::string_view segment, Scratch* scratch,
                     std::vector<std::int32_t>* ids) const;
  void SplitPiece(std::string_view piece, const PreTokenizerStep& step, Scratch* scratch,
                  std::vector<std::string_view>* out) const;
  void EncodeWord(std::string_view piece, Scratch* scratch, std::vector<std::int32_t>* ids) const;
  void Bpe(std::string_view word, Scratch* scratch, std::vector<std::int32_t>* ids) const;
};

}  // namespace internal

using internal::TokenizerData;

// ---------------------------------------------------------------------------------------
// Loading

namespace {

class Loader {
 public:
  explicit Loader(std::string source) : source_(std::move(source)) {}

  Status Error(const std::string& field, const std::string& what) const {
    return FieldError(source_, field, what);
  }

  // A boolean option: absent or null means `fallback`.
  Result<bool> Bool(const Json& obj, const char* key, const std::string& path, bool fallback) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return Error(path + "." + key, "must be true or false");
    return it->get<bool>();
  }

  Result<std::int32_t> Id(const Json& value, const std::string& path) {
    if (!value.is_number_integer() || value.get<std::int64_t>() < 0 ||
        (value.is_number_unsigned() && value.get<std::uint64_t>() > kMaxTokenId) ||
        value.get<std::int64_t>() > kMaxTokenId) {
      return Error(path, "must be an integer token id in [0, " + std::to_string(kMaxTokenId) + "]");
    }
    return static_cast<std::int32_t>(value.get<std::int64_t>());
  }

  Status LoadModel(const Json& doc, TokenizerData* t);
  Status LoadAddedTokens(const Json& doc, TokenizerData* t);
  Status LoadNormalizer(const Json& node, const std::string& path, TokenizerData* t);
  Status LoadPreTokenizer(const Json& node, const std::string& path, TokenizerData* t);
  Status LoadPostProcessor(const Json& node, const std::string& path, TokenizerData* t);
  Status LoadDecoder(const Json& doc);
  Status BuildIdTables(TokenizerData* t);

 private:
  std::string source_;
};

Status Loader::LoadModel(const Json& doc, TokenizerData* t) {
  auto model_it = doc.find("model");
  if (model_it == doc.end() || model_it->is_null()) return Error("model", "is missing");
  const Json& model = *model_it;
  if (!model.is_object()) return Error("model", "must be an object");

  auto type_it = model.find("type");
  if (type_it != model.end()) {
    if (!type_it->is_string()) return Error("model.type", "must be a string");
    const std::string type = type_it->get<std::string>();
    if (type != "BPE") {
      return Error("model.type", "is " + Quote(type) + "; only 'BPE' models are supported");
    }
  } else if (!model.contains("merges")) {
    // Old files omit the type; HF then recognizes BPE by its merges.
    return Error("model.type", "is missing (and there are no merges to recognize BPE by)");
  }

  auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return Error("model.dropout", "is set; BPE dropout (random merges) is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() &&
        !(it->is_string() && it->get_ref<const std::string&>().empty())) {
      return Error(std::string("model.") + key, "is set; subword affixes are not supported");
    }
  }

  Result<bool> ignore_merges = Bool(model, "ignore_merges", "model", false);
  if (!ignore_merges.ok()) return ignore_merges.status();
  Result<bool> byte_fallback = Bool(model, "byte_fallback", "model", false);
  if (!byte_fallback.ok()) return byte_fallback.status();
  Result<bool> fuse_unk = Bool(model, "fuse_unk", "model", false);
  if (!fuse_unk.ok()) return fuse_unk.status();
  t->ignore_merges = *ignore_merges;
  t->byte_fallback = *byte_fallback;
  t->fuse_unk = *fuse_unk;

  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end()) return Error("model.vocab", "is missing");
  if (!vocab_it->is_object()) {
    return Error("model.vocab", "must be an object mapping token strings to ids");
  }
  t->vocab.reserve(vocab_it->size());
  for (const auto& [token, id_json] : vocab_it->items()) {
    Result<std::int32_t> id = Id(id_json, "model.vocab[" + Quote(token) + "]");
    if (!id.ok()) return id.status();
    t->vocab.emplace(token, *id);
  }

  auto unk_it = model.find("unk_token");
  if (unk_it != model.end() && !unk_it->is_null()) {
    if (!unk_it->is_string()) return Error("model.unk_token", "must be a string or null");
    auto found = t->vocab.find(unk_it->get_ref<const std::string&>());
    if (found == t->vocab.end()) {
      return Error("model.unk_token",
                   "is " + Quote(unk_it->get<std::string>()) + ", which is not in model.vocab");
    }
    t->unk_id = found->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto found = t->vocab.find(std::string_view(name));
    t->byte_fallback_ids[b] = found == t->vocab.end() ? -1 : found->second;
  }

  auto merges_it = model.find("merges");
  if (merges_it == model.end() || merges_it->is_null()) return Status::Ok();
  if (!merges_it->is_array()) return Error("model.merges", "must be an array");
  const Json& merges = *merges_it;
  t->merges.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const std::string path = "model.merges[" + std::to_string(i) + "]";
    std::string left, right;
    const Json& entry = merges[i];
    if (entry.is_string()) {
      // Legacy form "left right": exactly one space (byte-level tokens never hold a space).
      const std::string& text = entry.get_ref<const std::string&>();
      const std::size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        return Error(path, "is " + Quote(text) + "; a merge string must be \"left right\"");
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    } else {
      return Error(path, "must be a \"left right\" string or a [\"left\", \"right\"] pair");
    }
    auto left_it = t->vocab.find(left);
    if (left_it == t->vocab.end()) {
      return Error(path, "refers to " + Quote(left) + ", which is not in model.vocab");
    }
    auto right_it = t->vocab.find(right);
    if (right_it == t->vocab.end()) {
      return Error(path, "refers to " + Quote(right) + ", which is not in model.vocab");
    }
    auto merged_it = t->vocab.find(left + right);
    if (merged_it == t->vocab.end()) {
      return Error(path, "merges into " + Quote(left + right) + ", which is not in model.vocab");
    }
    // A repeated pair takes its last rank, as HF's map construction does.
    t->merges[PairKey(left_it->second, right_it->second)] =
        MergeRule{static_cast<std::int32_t>(i), merged_it->second};
  }
  return Status::Ok();
}

Status Loader::LoadAddedTokens(const Json& doc, TokenizerData* t) {
  auto it = doc.find("added_tokens");
  if (it == doc.end() || it->is_null()) return Status::Ok();
  if (!it->is_array()) return Error("added_tokens", "must be an array");
  t->trie.emplace_back();  // root
  t->trie_root.fill(-1);
  for (std::size_t i = 0; i < it->size(); ++i) {
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    const Json& entry = (*it)[i];
    if (!entry.is_object()) return Error(path, "must be an object");
    AddedToken token;
    auto id_it = entry.find("id");
    if (id_it == entry.end()) return Error(path + ".id", "is missing");
    Result<std::int32_t> id = Id(*id_it, path + ".id");
    if (!id.ok()) return id.status();
    token.id = *id;
    auto content_it = entry.find("content");
    if (content_it == entry.end() || !content_it->is_string() ||
        content_it->get_ref<const std::string&>().empty()) {
      return Error(path + ".content", "must be a non-empty string");
    }
    token.content = content_it->get<std::string>();
    for (auto [key, flag] :
         {std::pair{"special", &token.special}, std::pair{"single_word", &token.single_word},
          std::pair{"lstrip", &token.lstrip}, std::pair{"rstrip", &token.rstrip}}) {
      Result<bool> value = Bool(entry, key, path, false);
      if (!value.ok()) return value.status();
      *flag = *value;
    }
    Result<bool> normalized = Bool(entry, "normalized", path, true);
    if (!normalized.ok()) return normalized.status();

    // Content that appears twice keeps its first id.
    if (!t->added_by_content.emplace(token.content, token.id).second) continue;
    const auto index = static_cast<std::int32_t>(t->added.size());
    std::int32_t node = 0;
    for (char c : token.content) {
      const auto byte = static_cast<unsigned char>(c);
      std::int32_t child = -1;
      for (const auto& [b, next] : t->trie[node].children) {
        if (b == byte) child = next;
      }
      if (child < 0) {
        child = static_cast<std::int32_t>(t->trie.size());
        t->trie[node].children.emplace_back(byte, child);
        t->trie.emplace_back();
      }
      node = child;
    }
    t->trie[node].token = index;
    const auto first = static_cast<unsigned char>(token.content[0]);
    for (const auto& [b, child] : t->trie[0].children) {
      if (b == first) t->trie_root[first] = child;
    }
    t->added.push_back(std::move(token));
  }
  return Status::Ok();
}

Status Loader::LoadNormalizer(const Json& node, const std::string& path, TokenizerData* t) {
  if (node.is_null()) return Status::Ok();
  if (!node.is_object()) return Error(path, "must be an object or null");
  auto type_it = node.find("type");
  if (type_it == node.end() || !type_it->is_string()) return Error(path + ".type", "is missing");
  const std::string type = type_it->get<std::string>();
  if (type == "NFC") {
    t->nfc = true;
    return Status::Ok();
  }
  if (type == "Sequence") {
    auto list = node.find("normalizers");
    if (list == node.end() || !list->is_array()) {
      return Error(path + ".normalizers", "must be an array");
    }
    for (std::size_t i = 0; i < list->size(); ++i) {
      DUET_RETURN_IF_ERROR(
          LoadNormalizer((*list)[i], path + ".normalizers[" + std::to_string(i) + "]", t));
    }
    return Status::Ok();
  }
  return Error(path + ".type",
               "is " + Quote(type) + "; supported normalizers: null, NFC, Sequence of those");
}

Status Loader::LoadPreTokenizer(const Json& node, const std::string& path, TokenizerData* t) {
  if (node.is_null()) return Status::Ok();
  if (!node.is_object()) return Error(path, "must be an object or null");
  auto type_it = node.find("type");
  if (type_it == node.end() || !type_it->is_string()) return Error(path + ".type", "is missing");
  const std::string type = type_it->get<std::string>();
  if (type == "Sequence") {
    auto list = node.find("pretokenizers");
    if (list == node.end() || !list->is_array()) {
      return Error(path + ".pretokenizers", "must be an array");
    }
    for (std::size_t i = 0; i < list->size(); ++i) {
      DUET_RETURN_IF_ERROR(
          LoadPreTokenizer((*list)[i], path + ".pretokenizers[" + std::to_string(i) + "]", t));
    }
    return Status::Ok();
  }
  // ByteLevel maps text into the byte alphabet, so nothing can split after it here.
  if (t->byte_level) {
    return Error(path, "follows a ByteLevel pre-tokenizer; ByteLevel must come last");
  }
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    Result<bool> add_prefix_space = Bool(node, "add_prefix_space", path, true);
    if (!add_prefix_space.ok()) return add_prefix_space.status();
    Result<bool> use_regex = Bool(node, "use_regex", path, true);
    if (!use_regex.ok()) return use_regex.status();
    step.byte_level = true;
    step.add_prefix_space = *add_prefix_space;
    step.use_regex = *use_regex;
    if (step.use_regex && !t->gpt2_regex) {
      Result<Regex> regex = Regex::Compile(kGpt2Regex);
      DUET_CHECK_MSG(regex.ok(), regex.error());
      t->gpt2_regex = *regex;
    }
    t->byte_level = true;
  } else if (type == "Split") {
    auto pattern = node.find("pattern");
    if (pattern == node.end() || !pattern->is_object() || pattern->size() != 1) {
      return Error(path + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
    }
    if (auto regex_it = pattern->find("Regex"); regex_it != pattern->end()) {
      if (!regex_it->is_string()) return Error(path + ".pattern.Regex", "must be a string");
      Result<Regex> regex = Regex::Compile(regex_it->get_ref<const std::string&>());
      if (!regex.ok())
        return Error(path + ".pattern.Regex", "is not a valid regex: " + regex.error());
      step.regex = *regex;
    } else if (auto string_it = pattern->find("String"); string_it != pattern->end()) {
      if (!string_it->is_string()) return Error(path + ".pattern.String", "must be a string");
      step.literal = string_it->get<std::string>();
    } else {
      return Error(path + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
    }
    auto behavior = node.find("behavior");
    if (behavior == node.end() || !behavior->is_string()) {
      return Error(path + ".behavior", "must be a string");
    }
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    bool known = false;
    for (const auto& [name, value] : kBehaviors) {
      if (*behavior == name) {
        step.behavior = value;
        known = true;
      }
    }
    if (!known) {
      return Error(path + ".behavior", "is " + Quote(behavior->get<std::string>()) +
                                           "; expected Removed, Isolated, MergedWithPrevious, "
                                           "MergedWithNext or Contiguous");
    }
    Result<bool> invert = Bool(node, "invert", path, false);
    if (!invert.ok()) return invert.status();
    step.invert = *invert;
  } else {
    return Error(path + ".type",
                 "is " + Quote(type) + "; supported pre-tokenizers: ByteLevel, Split, Sequence");
  }
  t->steps.push_back(std::move(step));
  return Status::Ok();
}

Status Loader::LoadPostProcessor(const Json& node, const std::string& path, TokenizerData* t) {
  if (node.is_null()) return Status::Ok();
  if (!node.is_object()) return Error(path, "must be an object or null");
  auto type_it = node.find("type");
  if (type_it == node.end() || !type_it->is_string()) return Error(path + ".type", "is missing");
  const std::string type = type_it->get<std::string>();
  if (type == "ByteLevel") return Status::Ok();  // only adjusts offsets
  if (type == "Sequence") {
    auto list = node.find("processors");
    if (list == node.end() || !list->is_array()) {
      return Error(path + ".processors", "must be an array");
    }
    for (std::size_t i = 0; i < list->size(); ++i) {
      DUET_RETURN_IF_ERROR(
          LoadPostProcessor((*list)[i], path + ".processors[" + std::to_string(i) + "]", t));
    }
    return Status::Ok();
  }
  if (type != "TemplateProcessing") {
    return Error(path + ".type",
                 "is " + Quote(type) +
                     "; supported post-processors: ByteLevel, TemplateProcessing, Sequence");
  }
  auto specials = node.find("special_tokens");
  if (specials != node.end() && !specials->is_null() && !specials->is_object()) {
    return Error(path + ".special_tokens", "must be an object");
  }
  auto single = node.find("single");
  if (single == node.end() || !single->is_array())
    return Error(path + ".single", "must be an array");
  std::vector<std::int32_t> prefix, suffix;
  bool seen_sequence = false;
  for (std::size_t i = 0; i < single->size(); ++i) {
    const std::string item_path = path + ".single[" + std::to_string(i) + "]";
    const Json& item = (*single)[i];
    if (item.is_object() && item.contains("Sequence")) {
      if (seen_sequence) return Error(item_path, "is a second Sequence in the single template");
      seen_sequence = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].is_object() ||
        !item["SpecialToken"].contains("id") || !item["SpecialToken"]["id"].is_string()) {
      return Error(item_path, "must be {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
    }
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    if (specials == node.end() || !specials->is_object() || !specials->contains(name)) {
      return Error(item_path,
                   "names " + Quote(name) + ", which is not in " + path + ".special_tokens");
    }
    const Json& special = (*specials)[name];
    const std::string ids_path = path + ".special_tokens[" + Quote(name) + "].ids";
    if (!special.is_object() || !special.contains("ids") || !special["ids"].is_array()) {
      return Error(ids_path, "must be an array of token ids");
    }
    for (const Json& id_json : special["ids"]) {
      Result<std::int32_t> id = Id(id_json, ids_path);
      if (!id.ok()) return id.status();
      (seen_sequence ? suffix : prefix).push_back(*id);
    }
  }
  if (!seen_sequence) return Error(path + ".single", "has no {\"Sequence\": ...} item");
  // A later processor wraps what the earlier ones produced.
  prefix.insert(prefix.end(), t->prefix_ids.begin(), t->prefix_ids.end());
  t->prefix_ids = std::move(prefix);
  t->suffix_ids.insert(t->suffix_ids.end(), suffix.begin(), suffix.end());
  return Status::Ok();
}

Status Loader::LoadDecoder(const Json& doc) {
  auto it = doc.find("decoder");
  if (it == doc.end() || it->is_null()) {
    return Error("decoder", "is missing; only the ByteLevel decoder is supported");
  }
  if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string()) {
    return Error("decoder.type", "is missing");
  }
  const std::string type = (*it)["type"].get<std::string>();
  if (type != "ByteLevel") {
    return Error("decoder.type", "is " + Quote(type) + "; only 'ByteLevel' is supported");
  }
  return Status::Ok();
}

// What HF's ByteLevel decoder makes of one token: each character mapped back to its byte;
// a token holding any character outside the alphabet is taken as its UTF-8 bytes instead.
std::string ByteLevelTokenBytes(std::string_view token) {
  std::string bytes;
  std::size_t pos = 0;
  while (pos < token.size()) {
    char32_t cp = 0;
    const std::size_t len = unicode::DecodeUtf8(token, pos, &cp);
    const int b = len == 0 ? -1 : unicode::ByteLevelCharToByte(cp);
    if (b < 0) return std::string(token);
    bytes.push_back(static_cast<char>(b));
    pos += len;
  }
  return bytes;
}

Status Loader::BuildIdTables(TokenizerData* t) {
  std::int64_t max_id = -1;
  for (const auto& [token, id] : t->vocab) max_id = std::max<std::int64_t>(max_id, id);
  for (const AddedToken& token : t->added) max_id = std::max<std::int64_t>(max_id, token.id);
  for (std::int32_t id : t->prefix_ids) max_id = std::max<std::int64_t>(max_id, id);
  for (std::int32_t id : t->suffix_ids) max_id = std::max<std::int64_t>(max_id, id);
  const std::int64_t count = static_cast<std::int64_t>(t->vocab.size() + t->added.size());
  // Dense tables are the point; refuse files whose ids would leave them mostly empty.
  if (max_id + 1 > 2 * count + 1024) {
    return Status::Error(source_ + ": token ids are too sparse (largest id " +
                         std::to_string(max_id) + " for " + std::to_string(count) + " tokens)");
  }
  const auto size = static_cast<std::size_t>(max_id + 1);
  t->id_token.assign(size, std::string());
  t->id_bytes.assign(size, std::string());
  t->id_flags.assign(size, 0);
  for (const auto& [token, id] : t->vocab) {
    // Two strings with one id: keep the smaller string, so the choice does not depend on
    // hash order.
    if ((t->id_flags[id] & kIdExists) && t->id_token[id] < token) continue;
    t->id_token[id] = token;
    t->id_bytes[id] = ByteLevelTokenBytes(token);
    t->id_flags[id] = kIdExists;
  }
  for (const AddedToken& token : t->added) {
    t->id_token[token.id] = token.content;
    t->id_bytes[token.id] = token.content;
    t->id_flags[token.id] = kIdExists | kIdAdded | (token.special ? kIdSpecial : 0);
  }
  for (std::int32_t id : t->prefix_ids) {
    if (!(t->id_flags[id] & kIdExists)) {
      return Status::Error(source_ + ": post_processor adds token id " + std::to_string(id) +
                           ", which is neither in model.vocab nor in added_tokens");
    }
  }
  for (std::int32_t id : t->suffix_ids) {
    if (!(t->id_flags[id] & kIdExists)) {
      return Status::Error(source_ + ": post_processor adds token id " + std::to_string(id) +
                           ", which is neither in model.vocab nor in added_tokens");
    }
  }
  return Status::Ok();
}

Status ParseTokenizer(const std::string& json_text, const std::string& source,
                      TokenizerData* impl) {
  Json doc;
  try {
    doc = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return Status::Error(source + ": invalid JSON: " + e.what());
  }
  if (!doc.is_object()) return Status::Error(source + ": top level must be a JSON object");
  impl->source = source;
  Loader loader(source);
  DUET_RETURN_IF_ERROR(loader.LoadModel(doc, impl));
  DUET_RETURN_IF_ERROR(loader.LoadAddedTokens(doc, impl));
  const Json kNull;
  auto field = [&](const char* key) -> const Json& {
    auto it = doc.find(key);
    return it == doc.end() ? kNull : *it;
  };
  DUET_RETURN_IF_ERROR(loader.LoadNormalizer(field("normalizer"), "normalizer", impl));
  DUET_RETURN_IF_ERROR(loader.LoadPreTokenizer(field("pre_tokenizer"), "pre_tokenizer", impl));
  DUET_RETURN_IF_ERROR(loader.LoadPostProcessor(field("post_processor"), "post_processor", impl));
  DUET_RETURN_IF_ERROR(loader.LoadDecoder(doc));
  return loader.BuildIdTables(impl);
}

}  // namespace

Result<Tokenizer> Tokenizer::FromJson(const std::string& json_text,
                                      const std::string& source_name) {
  auto impl = std::make_unique<TokenizerData>();
  try {
    DUET_RETURN_IF_ERROR(ParseTokenizer(json_text, source_name, impl.get()));
  } catch (const std::exception& e) {
    // Type checks above should leave nothing for nlohmann to throw; this keeps the promise
    // that no exception leaves the tokenizer even if one was missed.
    return Status::Error(source_name + ": malformed tokenizer.json: " + e.what());
  }
  return Tokenizer(std::shared_ptr<const TokenizerData>(std::move(impl)));
}

Result<Tokenizer> Tokenizer::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return Status::Error(path + ": read error");
  return FromJson(buffer.str(), path);
}

// ---------------------------------------------------------------------------------------
// Encoding

namespace {

// Start of the character that ends just before `pos` (one byte back when ill-formed).
std::size_t PrevCharStart(std::string_view text, std::size_t pos) {
  for (std::size_t k = 2; k <= 4 && k <= pos; ++k) {
    char32_t cp = 0;
    if (unicode::DecodeUtf8(text, pos - k, &cp) == k) return pos - k;
  }
  return pos - 1;
}

bool IsWhitespaceAt(std::string_view text, std::size_t pos, std::size_t* len) {
  char32_t cp = 0;
  *len = unicode::DecodeUtf8(text, pos, &cp);
  return *len != 0 && unicode::IsUnicodeWhitespace(cp);
}

// Approximates Rust's char::is_alphanumeric: ASCII letters and digits, and every non-ASCII
// character that is not whitespace (see the header).
bool IsWordCharAt(std::string_view text, std::size_t pos) {
  const auto b = static_cast<unsigned char>(text[pos]);
  if (b < 0x80) return std::isalnum(b) != 0;
  std::size_t len = 0;
  return !IsWhitespaceAt(text, pos, &len);
}

}  // namespace

void TokenizerData::SplitOnAddedTokens(
    std::string_view text, SpecialTokens mode,
    const std::function<void(std::string_view, std::int32_t)>& emit) const {
  std::size_t segment_start = 0;
  std::size_t pos = 0;
  while (!trie.empty() && pos < text.size()) {
    // Longest added token starting at `pos` (leftmost-longest, as HF's Aho-Corasick).
    if (trie_root[static_cast<unsigned char>(text[pos])] < 0) {
      ++pos;
      continue;
    }
    std::int32_t node = 0;
    std::int32_t best = -1;
    std::size_t best_end = 0;
    for (std::size_t j = pos; j < text.size(); ++j) {
      std::int32_t child = -1;
      for (const auto& [b, next_node] : trie[node].children) {
        if (b == static_cast<unsigned char>(text[j])) child = next_node;
      }
      if (child < 0) break;
      node = child;
      const std::int32_t token = trie[node].token;
      if (token >= 0 && !(mode == SpecialTokens::kAsText && added[token].special)) {
        best = token;
        best_end = j + 1;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = added[best];
    if (token.single_word && ((pos > 0 && IsWordCharAt(text, PrevCharStart(text, pos))) ||
                              (best_end < text.size() && IsWordCharAt(text, best_end)))) {
      pos = best_end;  // HF drops this match and looks for the next one after it
      continue;
    }
    std::size_t start = pos;
    std::size_t end = best_end;
    if (token.lstrip) {
      while (start > segment_start) {
        const std::size_t prev = PrevCharStart(text, start);
        std::size_t len = 0;
        if (!IsWhitespaceAt(text, prev, &len) || prev + len != start) break;
        start = prev;
      }
    }
    if (token.rstrip) {
      std::size_t len = 0;
      while (end < text.size() && IsWhitespaceAt(text, end, &len)) end += len;
    }
    if (start > segment_start) emit(text.substr(segment_start, start - segment_start), -1);
    emit(std::string_view(), token.id);
    segment_start = pos = end;
  }
  if (segment_start < text.size()) emit(text.substr(segment_start), -1);
}

void TokenizerData::SplitPiece(std::string_view piece, const PreTokenizerStep& step,
                               Scratch* scratch, std::vector<std::string_view>* out) const {
  struct Span {
    std::size_t start, end;
    bool is_match;
  };
  std::vector<std::pair<std::size_t, std::size_t>>& matches = scratch->matches;
  matches.clear();
  const Regex* regex = step.byte_level ? &*gpt2_regex : (step.regex ? &*step.regex : nullptr);
  if (regex != nullptr) {
    regex->FindAll(piece, &matches);
  } else if (!step.literal.empty()) {
    for (std::size_t at = piece.find(step.literal); at != std::string_view::npos;
         at = piece.find(step.literal, at + step.literal.size())) {
      matches.emplace_back(at, at + step.literal.size());
    }
  }
  // Matches and the gaps between them, covering the piece (HF's find_matches).
  std::vector<Span> spans;
  spans.reserve(2 * matches.size() + 1);
  std::size_t prev = 0;
  for (const auto& [start, end] : matches) {
    if (start != prev) spans.push_back({prev, start, false});
    spans.push_back({start, end, true});
    prev = end;
  }
  if (prev != piece.size() || spans.empty()) spans.push_back({prev, piece.size(), false});
  if (step.invert) {
    for (Span& s : spans) s.is_match = !s.is_match;
  }

  std::vector<Span> merged;
  merged.reserve(spans.size());
  switch (step.behavior) {
    case SplitBehavior::kIsolated:
      merged = spans;
      break;
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) merged.push_back(s);
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().start = it->start;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    }
  }
  for (const Span& s : merged) {
    if (s.end > s.start) out->push_back(piece.substr(s.start, s.end - s.start));
  }
}

void TokenizerData::EncodeSegment(std::string_view segment, Scratch* scratch,
                                  std::vector<std::int32_t>* ids) const {
  if (segment.empty()) return;
  std::string normalized;
  if (nfc) {
    normalized = unicode::NfcNormalize(segment);
    segment = normalized;
  }
  std::vector<std::string_view> pieces{segment};
  std::vector<std::string_view> next;
  std::deque<std::string> owned;  // pieces given a prefix space; deque keeps views valid
  for (const PreTokenizerStep& step : steps) {
    next.clear();
    for (std::string_view piece : pieces) {
      if (step.byte_level) {
        if (step.add_prefix_space && piece.front() != ' ') {
          std::string& spaced = owned.emplace_back();
          spaced.reserve(piece.size() + 1);
          spaced.push_back(' ');
          spaced.append(piece);
          piece = spaced;
        }
        if (!step.use_regex) {
          next.push_back(piece);
          continue;
        }
      }
      SplitPiece(piece, step, scratch, &next);
    }
    pieces.swap(next);
  }
  for (std::string_view piece : pieces) EncodeWord(piece, scratch, ids);
}

void TokenizerData::EncodeWord(std::string_view piece, Scratch* scratch,
                               std::vector<std::int32_t>* ids) const {
  std::string_view word = piece;
  if (byte_level) {
    const auto& alphabet = unicode::ByteLevelAlphabet();
    scratch->word.clear();
    for (char c : piece) scratch->word += alphabet[static_cast<unsigned char>(c)];
    word = scratch->word;
  }
  if (ignore_merges) {
    // Llama-3: a word that is itself a vocabulary entry is emitted whole, merges or not.
    auto it = vocab.find(word);
    if (it != vocab.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache.find(word);
    if (it != cache.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t first = ids->size();
  Bpe(word, scratch, ids);
  if (cacheable) {
    std::vector<std::int32_t> word_ids(ids->begin() + first, ids->end());
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kCacheEntries) cache.clear();
    cache.emplace(std::string(word), std::move(word_ids));
  }
}

void TokenizerData::Bpe(std::string_view word, Scratch* scratch,
                        std::vector<std::int32_t>* ids) const {
  // Initial symbols: one per character, as HF's merge_word makes them. An unknown character
  // leaves an <unk> pending that is written only before the next known character (or at
  // the end), fusing with further unknown ones under fuse_unk; byte-fallback tokens do not
  // flush it, so they can come before it. Odd, but it is what HF emits.
  std::vector<std::int32_t>& symbols = scratch->symbols;
  symbols.clear();
  bool unk_pending = false;
  for (std::size_t pos = 0; pos < word.size();) {
    const std::size_t len = unicode::CharLengthAt(word, pos);
    const std::string_view ch = word.substr(pos, len);
    pos += len;
    auto it = vocab.find(ch);
    if (it != vocab.end()) {
      if (unk_pending) symbols.push_back(*unk_id);
      unk_pending = false;
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (char c : ch) all = all && byte_fallback_ids[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : ch) symbols.push_back(byte_fallback_ids[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id) {
      if (unk_pending && !fuse_unk) symbols.push_back(*unk_id);
      unk_pending = true;
    }
    // Without an unk token HF drops the character; so do we.
  }
  if (unk_pending) symbols.push_back(*unk_id);

  // Repeatedly merge the adjacent pair of lowest rank, leftmost first, through a min-heap of
  // candidate pairs over a linked list of symbols (O(n log n) even for very long words).
  const auto n = static_cast<std::int32_t>(symbols.size());
  if (n >= 2 && !merges.empty()) {
    std::vector<std::int32_t>& prev = scratch->prev;
    std::vector<std::int32_t>& next = scratch->next;
    prev.resize(n);
    next.resize(n);
    for (std::int32_t i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    auto& heap = scratch->heap;
    heap.clear();
    auto push_pair = [&](std::int32_t left) {
      if (left < 0 || next[left] < 0) return;
      const std::int32_t right = next[left];
      auto it = merges.find(PairKey(symbols[left], symbols[right]));
      if (it == merges.end()) return;
      heap.push_back({it->second.rank, left, symbols[left], symbols[right]});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    };
    for (std::int32_t i = 0; i + 1 < n; ++i) push_pair(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      const Scratch::Entry top = heap.back();
      heap.pop_back();
      const std::int32_t left = top.pos;
      const std::int32_t right = next[left];
      // Skip entries made stale by an earlier merge: symbol ids only ever grow into longer
      // tokens, so matching ids mean the pair is still there.
      if (symbols[left] < 0 || right < 0 || symbols[left] != top.left ||
          symbols[right] != top.right) {
        continue;
      }
      symbols[left] = merges.at(PairKey(top.left, top.right)).merged_id;
      symbols[right] = -1;
      next[left] = next[right];
      if (next[right] >= 0) prev[next[right]] = left;
      push_pair(prev[left]);
      push_pair(left);
    }
  }
  for (std::int32_t id : symbols) {
    if (id >= 0) ids->push_back(id);
  }
}

std::vector<std::int32_t> Tokenizer::Encode(std::string_view text, bool add_bos,
                                            SpecialTokens special) const {
  const TokenizerData& impl = *impl_;
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_bos) ids.insert(ids.end(), impl.prefix_ids.begin(), impl.prefix_ids.end());
  TokenizerData::Scratch scratch;
  impl.SplitOnAddedTokens(text, special, [&](std::string_view segment, std::int32_t added_id) {
    if (added_id >= 0) {
      ids.push_back(added_id);
    } else {
      impl.EncodeSegment(segment, &scratch, &ids);
    }
  });
  if (add_bos) ids.insert(ids.end(), impl.suffix_ids.begin(), impl.suffix_ids.end());
  return ids;
}

// ---------------------------------------------------------------------------------------
// Decoding and lookups

namespace {

// Appends the bytes of `id` (U+FFFD for ids that name no token) unless it is skipped.
void AppendIdBytes(const std::vector<std::string>& id_bytes,
                   const std::vector<std::uint8_t>& id_flags, std::int32_t id,
                   bool skip_special_tokens, std::string* out) {
  if (id < 0 || static_cast<std::size_t>(id) >= id_flags.size() || !(id_flags[id] & kIdExists)) {
    out->append(unicode::kReplacementChar);
    return;
  }
  if (skip_special_tokens && (id_flags[id] & kIdSpecial)) return;
  out->append(id_bytes[id]);
}

}  // namespace

std::string Tokenizer::Decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (std::int32_t id : ids) {
    AppendIdBytes(impl_->id_bytes, impl_->id_flags, id, skip_special_tokens, &bytes);
  }
  return unicode::LossyUtf8(bytes);
}

std::int32_t Tokenizer::vocab_size() const {
  return static_cast<std::int32_t>(impl_->id_flags.size());
}

std::optional<std::int32_t> Tokenizer::bos_token_id() const {
  if (impl_->prefix_ids.empty()) return std::nullopt;
  return impl_->prefix_ids.front();
}

std::optional<std::int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end()) {
    return it->second;
  }
  if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::string_view Tokenizer::IdToToken(std::int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->id_token[id];
}

bool Tokenizer::IsSpecial(std::int32_t id) const {
  return id >= 0 && id < vocab_size() && (impl_->id_flags[id] & kIdSpecial);
}

std::string_view Tokenizer::TokenBytes(std::int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->id_bytes[id];
}

const std::string& Tokenizer::source_name() const { return impl_->source; }

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDecoder::Push(std::int32_t id) {
  AppendIdBytes(tokenizer_.impl_->id_bytes, tokenizer_.impl_->id_flags, id, skip_special_tokens_,
                &pending_);
  std::string out;
  const std::size_t consumed = unicode::AppendLossyUtf8(pending_, /*final=*/false, &out);
  pending_.erase(0, consumed);
  return out;
}

std::string IncrementalDecoder::Flush() {
  std::string out = unicode::LossyUtf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace duet::backend
