// Tokenizer behaviour beyond the HF fixtures: load errors name the file and the field, BPE
// merge order and ignore_merges on hand-made vocabularies, added-token matching, decoding of
// bad ids, and byte-exact handling of text that is not valid UTF-8.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "backend/tokenizer/test_tokenizer.h"
#include "backend/tokenizer/tokenizer.h"
#include "backend/tokenizer/unicode_util.h"
#include "tests/tokenizer/tokenizer_test_util.h"

namespace duet::backend {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<std::int32_t>;

constexpr const char* kSource = "models/x/tokenizer.json";

// A tiny BPE without byte-level pre-tokenization: the whole text is one word.
Json MinimalDoc() {
  Json doc;
  doc["model"] = {{"type", "BPE"},
                  {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}, {"bc", 5}}},
                  {"merges", Json::array({"a b"})}};
  doc["decoder"] = {{"type", "ByteLevel"}};
  doc["added_tokens"] = Json::array({{{"id", 6}, {"content", "<s>"}, {"special", true}}});
  return doc;
}

Result<Tokenizer> FromDoc(const Json& doc) { return Tokenizer::FromJson(doc.dump(), kSource); }

// Loading fails with a message that starts with the file name and contains every part.
void ExpectTextLoadError(const std::string& json_text, const std::vector<std::string>& parts) {
  Result<Tokenizer> tokenizer = Tokenizer::FromJson(json_text, kSource);
  ASSERT_FALSE(tokenizer.ok()) << json_text;
  EXPECT_EQ(tokenizer.error().rfind(std::string(kSource) + ": ", 0), 0u) << tokenizer.error();
  for (const std::string& part : parts) {
    EXPECT_NE(tokenizer.error().find(part), std::string::npos)
        << "'" << part << "' not in: " << tokenizer.error();
  }
}
void ExpectLoadError(const Json& doc, const std::vector<std::string>& parts) {
  ExpectTextLoadError(doc.dump(), parts);
}

const Tokenizer& TestTokenizer() {
  static const Tokenizer tokenizer = [] {
    Result<Tokenizer> t = Tokenizer::Load(testing::FixturePath("test_tokenizer.json"));
    DUET_CHECK_MSG(t.ok(), t.error());
    return *t;
  }();
  return tokenizer;
}

TEST(TokenizerLoad, MinimalDocLoads) {
  Result<Tokenizer> tokenizer = FromDoc(MinimalDoc());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
  EXPECT_EQ(tokenizer->vocab_size(), 7);
  EXPECT_FALSE(tokenizer->bos_token_id().has_value());
  EXPECT_EQ(tokenizer->source_name(), kSource);
}

TEST(TokenizerLoad, ErrorsNameFileAndField) {
  ExpectTextLoadError("{\"model\": ", {"invalid JSON"});
  ExpectTextLoadError("not json at all", {"invalid JSON"});
  ExpectTextLoadError("[1, 2, 3]", {"top level must be a JSON object"});

  Json doc = MinimalDoc();
  doc.erase("model");
  ExpectLoadError(doc, {"field 'model' is missing"});

  doc = MinimalDoc();
  doc["model"]["type"] = "WordPiece";
  ExpectLoadError(doc, {"field 'model.type'", "'WordPiece'", "BPE"});

  doc = MinimalDoc();
  doc["model"]["vocab"] = Json::array({"a", "b"});
  ExpectLoadError(doc, {"field 'model.vocab'", "must be an object"});

  doc = MinimalDoc();
  doc["model"]["vocab"]["b"] = "one";
  ExpectLoadError(doc, {"field 'model.vocab['b']'", "integer token id"});

  doc = MinimalDoc();
  doc["model"]["vocab"]["b"] = -3;
  ExpectLoadError(doc, {"field 'model.vocab['b']'"});

  doc = MinimalDoc();
  doc["model"]["merges"] = Json::array({"a b", "a zz"});
  ExpectLoadError(doc, {"field 'model.merges[1]'", "'zz'", "not in model.vocab"});

  doc = MinimalDoc();
  doc["model"]["merges"] = Json::array({Json::array({"b", "a"})});
  ExpectLoadError(doc, {"field 'model.merges[0]'", "merges into 'ba'", "not in model.vocab"});

  doc = MinimalDoc();
  doc["model"]["merges"] = Json::array({"a  b"});
  ExpectLoadError(doc, {"field 'model.merges[0]'"});

  doc = MinimalDoc();
  doc["model"]["merges"] = Json::array({7});
  ExpectLoadError(doc, {"field 'model.merges[0]'", "\"left right\""});

  doc = MinimalDoc();
  doc["model"]["merges"] = "a b";
  ExpectLoadError(doc, {"field 'model.merges'", "must be an array"});

  doc = MinimalDoc();
  doc["model"]["unk_token"] = "<unk>";
  ExpectLoadError(doc, {"field 'model.unk_token'", "'<unk>'"});

  doc = MinimalDoc();
  doc["model"]["dropout"] = 0.1;
  ExpectLoadError(doc, {"field 'model.dropout'"});

  doc = MinimalDoc();
  doc["model"]["continuing_subword_prefix"] = "##";
  ExpectLoadError(doc, {"field 'model.continuing_subword_prefix'"});

  doc = MinimalDoc();
  doc["model"]["vocab"]["far"] = 16000000;
  ExpectLoadError(doc, {"too sparse"});

  doc = MinimalDoc();
  doc["model"]["ignore_merges"] = "yes";
  ExpectLoadError(doc, {"field 'model.ignore_merges'", "true or false"});
}

TEST(TokenizerLoad, PipelineErrorsNameTheirField) {
  Json doc = MinimalDoc();
  doc["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       Json::array(
           {{{"type", "ByteLevel"}, {"use_regex", false}},
            {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"}}})}};
  ExpectLoadError(doc, {"pre_tokenizer.pretokenizers[1]", "ByteLevel must come last"});

  // An invalid regex: PCRE2's own message and the offset in the pattern.
  doc = MinimalDoc();
  doc["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", Json::array({{{"type", "Split"},
                                                          {"pattern", {{"Regex", "(\\p{L}+|[a-"}}},
                                                          {"behavior", "Isolated"}}})}};
  ExpectLoadError(doc, {"field 'pre_tokenizer.pretokenizers[0].pattern.Regex'",
                        "is not a valid regex", "missing terminating ]", "at offset 11"});

  doc = MinimalDoc();
  doc["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"behavior", "Odd"}};
  ExpectLoadError(doc, {"field 'pre_tokenizer.behavior'", "'Odd'"});

  doc = MinimalDoc();
  doc["pre_tokenizer"] = {{"type", "Split"}, {"pattern", "\\s"}, {"behavior", "Isolated"}};
  ExpectLoadError(doc, {"field 'pre_tokenizer.pattern'"});

  doc = MinimalDoc();
  doc["pre_tokenizer"] = {{"type", "Whitespace"}};
  ExpectLoadError(doc, {"field 'pre_tokenizer.type'", "'Whitespace'"});

  doc = MinimalDoc();
  doc["normalizer"] = {{"type", "NFKC"}};
  ExpectLoadError(doc, {"field 'normalizer.type'", "'NFKC'", "NFC"});

  doc = MinimalDoc();
  doc["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", Json::array({{{"type", "NFC"}}, {{"type", "Lowercase"}}})}};
  ExpectLoadError(doc, {"field 'normalizer.normalizers[1].type'", "'Lowercase'"});

  doc = MinimalDoc();
  doc.erase("decoder");
  ExpectLoadError(doc, {"field 'decoder'", "ByteLevel"});

  doc = MinimalDoc();
  doc["decoder"] = {{"type", "WordPiece"}};
  ExpectLoadError(doc, {"field 'decoder.type'", "'WordPiece'"});

  doc = MinimalDoc();
  doc["post_processor"] = {{"type", "RobertaProcessing"}};
  ExpectLoadError(doc, {"field 'post_processor.type'", "'RobertaProcessing'"});

  doc = MinimalDoc();
  doc["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", Json::array({{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"special_tokens", Json::object()}};
  ExpectLoadError(doc, {"field 'post_processor.single[0]'", "'<bos>'"});

  doc = MinimalDoc();
  doc["added_tokens"][0]["id"] = -1;
  ExpectLoadError(doc, {"field 'added_tokens[0].id'"});

  doc = MinimalDoc();
  doc["added_tokens"][0]["content"] = "";
  ExpectLoadError(doc, {"field 'added_tokens[0].content'"});

  doc = MinimalDoc();
  doc["added_tokens"][0]["special"] = 1;
  ExpectLoadError(doc, {"field 'added_tokens[0].special'"});
}

TEST(TokenizerLoad, LoadNamesMissingFile) {
  Result<Tokenizer> tokenizer = Tokenizer::Load("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.error(), "/nonexistent/dir/tokenizer.json: cannot open file");
}

TEST(TokenizerBpe, MergesApplyInRankOrder) {
  Json doc = MinimalDoc();
  doc["model"]["merges"] = Json::array({"b c", "a b"});
  Result<Tokenizer> tokenizer = FromDoc(doc);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
  EXPECT_EQ(tokenizer->Encode("abc"), (Ids{0, 5}));  // "b c" ranks first: a + bc
  doc["model"]["merges"] = Json::array({Json::array({"a", "b"}), Json::array({"b", "c"})});
  tokenizer = FromDoc(doc);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
  EXPECT_EQ(tokenizer->Encode("abc"), (Ids{3, 2}));  // pair form, "a b" first: ab + c
  EXPECT_EQ(tokenizer->Encode("cabab"), (Ids{2, 3, 3}));
}

TEST(TokenizerBpe, IgnoreMergesEmitsWholeVocabularyWords) {
  Json doc = MinimalDoc();
  Result<Tokenizer> tokenizer = FromDoc(doc);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
  EXPECT_EQ(tokenizer->Encode("abc"), (Ids{3, 2}));  // merges only reach ab + c
  doc["model"]["ignore_merges"] = true;
  tokenizer = FromDoc(doc);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
  EXPECT_EQ(tokenizer->Encode("abc"), (Ids{4}));
  EXPECT_EQ(tokenizer->Encode("abca"), (Ids{3, 2, 0}));  // not a vocabulary word: merges
}

TEST(TokenizerBpe, LongWordsMergeCorrectly) {
  // 100k identical characters: the heap-based merge stays fast and merges left to right.
  Json doc;
  doc["model"] = {{"type", "BPE"},
                  {"vocab", {{"a", 0}, {"aa", 1}, {"aaaa", 2}}},
                  {"merges", Json::array({"a a", "aa aa"})}};
  doc["decoder"] = {{"type", "ByteLevel"}};
  Result<Tokenizer> tokenizer = FromDoc(doc);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
  const std::string text(100001, 'a');
  const Ids ids = tokenizer->Encode(text);
  ASSERT_EQ(ids.size(), 25001u);
  EXPECT_EQ(ids.front(), 2);
  EXPECT_EQ(ids.back(), 0);
  EXPECT_EQ(tokenizer->Decode(ids), text);
  EXPECT_EQ(tokenizer->Encode("aaaaaaa"), (Ids{2, 1, 0}));
}

TEST(TokenizerAddedTokens, LongestMatchWinsAndSpecialsCanBePlainText) {
  Json doc = MinimalDoc();
  doc["added_tokens"].push_back({{"id", 7}, {"content", "<s>a"}, {"special", false}});
  doc["added_tokens"].push_back({{"id", 8}, {"content", "<t>"}, {"special", false}});
  doc["model"]["vocab"]["<"] = 9;
  doc["model"]["vocab"][">"] = 10;
  doc["model"]["vocab"]["s"] = 11;
  Result<Tokenizer> tokenizer = FromDoc(doc);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
  EXPECT_EQ(tokenizer->Encode("<s>ab<s>b"), (Ids{7, 1, 6, 1}));
  EXPECT_EQ(tokenizer->Encode("<s><t>"), (Ids{6, 8}));
  // As plain text the special <s> is ordinary characters; the non-special tokens still match.
  EXPECT_EQ(tokenizer->Encode("<s>b<t>", false, SpecialTokens::kAsText), (Ids{9, 11, 10, 1, 8}));
  EXPECT_EQ(tokenizer->Encode("<s>a", false, SpecialTokens::kAsText), (Ids{7}));
  EXPECT_TRUE(tokenizer->IsSpecial(6));
  EXPECT_FALSE(tokenizer->IsSpecial(7));
  EXPECT_EQ(tokenizer->TokenToId("<s>a"), 7);
  EXPECT_EQ(tokenizer->IdToToken(6), "<s>");
}

TEST(TokenizerEncode, TestTokenizerBasics) {
  const Tokenizer& tokenizer = TestTokenizer();
  EXPECT_EQ(tokenizer.vocab_size(), testing::kFixtureVocabSize + 7);
  EXPECT_EQ(tokenizer.bos_token_id(), testing::kFixtureVocabSize);
  EXPECT_TRUE(tokenizer.Encode("").empty());
  EXPECT_EQ(tokenizer.Encode("", true), (Ids{testing::kFixtureVocabSize}));
  EXPECT_EQ(tokenizer.TokenToId("<|eot_id|>"), testing::kFixtureVocabSize + 4);
  EXPECT_TRUE(tokenizer.IsSpecial(testing::kFixtureVocabSize + 4));
  EXPECT_EQ(tokenizer.TokenToId("\xC4\xA0the"), tokenizer.Encode(" the").at(0));  // "Ġthe"
  EXPECT_EQ(tokenizer.IdToToken(tokenizer.Encode(" the").at(0)), "\xC4\xA0the");
  EXPECT_EQ(tokenizer.TokenBytes(tokenizer.Encode(" the").at(0)), " the");
  EXPECT_EQ(tokenizer.IdToToken(-1), "");
  EXPECT_EQ(tokenizer.TokenBytes(1 << 20), "");
  EXPECT_FALSE(tokenizer.TokenToId("no such token").has_value());
}

TEST(TokenizerEncode, AnyBytesRoundTripThroughTokenBytes) {
  // Byte-level BPE is lossless even for text that is not UTF-8: every byte has a token.
  const Tokenizer& tokenizer = TestTokenizer();
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string text(rng() % 64, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 4 == 0 ? rng() % 256 : 'a' + rng() % 26);
    std::string bytes;
    for (std::int32_t id : tokenizer.Encode(text, false, SpecialTokens::kAsText)) {
      bytes += tokenizer.TokenBytes(id);
    }
    EXPECT_EQ(bytes, text);
    EXPECT_EQ(tokenizer.Decode(tokenizer.Encode(text)), unicode::LossyUtf8(text));
  }
}

TEST(TokenizerEncode, ConcurrentEncodesAgree) {
  const Tokenizer& tokenizer = TestTokenizer();
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "word" + std::to_string(i % 97) + " and more text, ";
  const Ids expected = tokenizer.Encode(text);
  Ids a, b;
  std::thread t1([&] { a = tokenizer.Encode(text); });
  std::thread t2([&] { b = tokenizer.Encode(text); });
  t1.join();
  t2.join();
  EXPECT_EQ(a, expected);
  EXPECT_EQ(b, expected);
}

TEST(TokenizerDecode, BadIdsBecomeReplacementCharacters) {
  const Tokenizer& tokenizer = TestTokenizer();
  const Ids hello = tokenizer.Encode("hello");
  Ids ids = hello;
  ids.push_back(-5);
  ids.push_back(tokenizer.vocab_size());
  ids.push_back(1 << 30);
  ids.insert(ids.end(), hello.begin(), hello.end());
  EXPECT_EQ(tokenizer.Decode(ids), "hello\uFFFD\uFFFD\uFFFDhello");
}

TEST(TokenizerDecode, SkipSpecialTokens) {
  const Tokenizer& tokenizer = TestTokenizer();
  const Ids ids = tokenizer.Encode("<|start_header_id|>user<|end_header_id|>hi<|eot_id|>", true);
  EXPECT_EQ(tokenizer.Decode(ids),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>hi<|eot_id|>");
  EXPECT_EQ(tokenizer.Decode(ids, true), "userhi");
}

TEST(TokenizerDecode, GapsInVocabularyDecodeAsReplacement) {
  Json doc = MinimalDoc();
  doc["model"]["vocab"]["z"] = 20;  // ids 7..19 name nothing
  Result<Tokenizer> tokenizer = FromDoc(doc);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
  EXPECT_EQ(tokenizer->vocab_size(), 21);
  EXPECT_EQ(tokenizer->Decode(Ids{0, 12, 20}), "a\uFFFDz");
}

}  // namespace
}  // namespace duet::backend
