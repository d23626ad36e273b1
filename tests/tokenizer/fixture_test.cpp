// Checks Duet's tokenizer against Hugging Face `tokenizers` through committed fixtures
// (scripts/make_tokenizer_fixtures.py): the test tokenizer JSON is what the C++ code makes,
// and every recorded encoding and decoding is reproduced token for token.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/tokenizer/test_tokenizer.h"
#include "backend/tokenizer/tokenizer.h"
#include "tests/tokenizer/tokenizer_test_util.h"

namespace duet::backend {
namespace {

using testing::FixturePath;
using testing::ReadFile;

TEST(TestTokenizerFixture, CommittedJsonIsWhatTheCodeMakes) {
  const std::string json = MakeTestTokenizerJson(testing::kFixtureVocabSize);
  const std::string path = FixturePath("test_tokenizer.json");
  const char* update = std::getenv("DUET_UPDATE_FIXTURES");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(path, std::ios::binary) << json;
    GTEST_SKIP() << "wrote " << path << "; now run scripts/make_tokenizer_fixtures.py";
  }
  EXPECT_EQ(ReadFile(path), json) << "the test tokenizer changed: regenerate the fixtures (see "
                                     "scripts/make_tokenizer_fixtures.py)";
}

class HfEncodings : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string text = ReadFile(FixturePath("encodings.json"));
    ASSERT_FALSE(text.empty()) << "missing " << FixturePath("encodings.json");
    doc_ = nlohmann::json::parse(text);
    for (const auto& [name, file] : doc_["tokenizers"].items()) {
      Result<Tokenizer> tokenizer = Tokenizer::Load(FixturePath(file.get<std::string>()));
      ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
      tokenizers_.emplace(name, *tokenizer);
    }
  }
  nlohmann::json doc_;
  std::map<std::string, Tokenizer> tokenizers_;
};

TEST_F(HfEncodings, EncodeMatchesTokenForToken) {
  ASSERT_GE(doc_["cases"].size(), 100u);
  for (const auto& c : doc_["cases"]) {
    const Tokenizer& tokenizer = tokenizers_.at(c["tokenizer"].get<std::string>());
    const std::string text = c["text"].get<std::string>();
    const SpecialTokens mode =
        c["special_tokens_as_text"].get<bool>() ? SpecialTokens::kAsText : SpecialTokens::kParse;
    const std::vector<std::int32_t> expected = c["ids"].get<std::vector<std::int32_t>>();
    EXPECT_EQ(tokenizer.Encode(text, c["add_special_tokens"].get<bool>(), mode), expected)
        << c["tokenizer"] << " text: " << ::testing::PrintToString(text)
        << " add_special_tokens=" << c["add_special_tokens"]
        << " special_tokens_as_text=" << c["special_tokens_as_text"];
  }
}

TEST_F(HfEncodings, DecodeMatches) {
  for (const auto& c : doc_["cases"]) {
    const Tokenizer& tokenizer = tokenizers_.at(c["tokenizer"].get<std::string>());
    const std::vector<std::int32_t> ids = c["ids"].get<std::vector<std::int32_t>>();
    EXPECT_EQ(tokenizer.Decode(ids, false), c["decoded"].get<std::string>()) << c["text"];
    // Recorded only where skipping special tokens changes the text.
    EXPECT_EQ(tokenizer.Decode(ids, true),
              c.value("decoded_skip_special", c["decoded"].get<std::string>()))
        << c["text"];
  }
}

TEST_F(HfEncodings, DecodeOfEncodeIsIdentity) {
  for (const auto& c : doc_["cases"]) {
    const Tokenizer& tokenizer = tokenizers_.at(c["tokenizer"].get<std::string>());
    // The other variants normalize, drop or add text on purpose.
    static const std::set<std::string> kLossless = {"llama3_style", "gpt2_style", "ignore_merges",
                                                    "no_ignore_merges"};
    if (!kLossless.contains(c["tokenizer"].get<std::string>())) continue;
    const std::string text = c["text"].get<std::string>();
    for (SpecialTokens mode : {SpecialTokens::kParse, SpecialTokens::kAsText}) {
      EXPECT_EQ(tokenizer.Decode(tokenizer.Encode(text, false, mode), false), text);
    }
  }
}

}  // namespace
}  // namespace duet::backend
