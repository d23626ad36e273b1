// Tests for the shared JSON field helpers: one wording for field errors, null as absent for
// optional and required fields alike, and integer bounds that never wrap.
#include "common/json_util.h"

#include <gtest/gtest.h>

#include <string>

namespace duet {
namespace {

using nlohmann::json;

TEST(JsonUtilTest, FieldErrorWording) {
  EXPECT_EQ(FieldError("a/b.json: nodes[0]", "gpus", "is missing").message(),
            "a/b.json: nodes[0]: field 'gpus' is missing");
}

TEST(JsonUtilTest, NullIsAbsent) {
  const json doc = {{"n", nullptr}, {"s", nullptr}, {"b", nullptr}, {"i", nullptr}};
  EXPECT_FALSE(JsonHas(doc, "n"));
  EXPECT_FALSE(JsonHas(doc, "missing"));
  EXPECT_TRUE(JsonHas(json{{"zero", 0}}, "zero"));
  EXPECT_EQ(*JsonNumberOr(doc, "n", 1.5, "f"), 1.5);
  EXPECT_EQ(*JsonStringOr(doc, "s", "x", "f"), "x");
  EXPECT_EQ(*JsonBoolOr(doc, "b", true, "f"), true);
  EXPECT_EQ(*JsonIntOr(doc, "i", 7, "f"), 7);
  EXPECT_EQ(*JsonIntIn(doc, "i", 1, 10, "f", 3), 3);
  // Required fields that are null are missing, in the same words as absent ones.
  for (const char* key : {"n", "missing"}) {
    EXPECT_EQ(JsonNumber(doc, key, "f").error(), "f: field '" + std::string(key) + "' is missing");
    EXPECT_EQ(JsonInt(doc, key, "f").error(), "f: field '" + std::string(key) + "' is missing");
    EXPECT_EQ(JsonString(doc, key, "f").error(), "f: field '" + std::string(key) + "' is missing");
    EXPECT_EQ(JsonIntIn(doc, key, 1, 2, "f").error(),
              "f: field '" + std::string(key) + "' is missing");
  }
}

TEST(JsonUtilTest, WrongTypesNameTheField) {
  const json doc = {{"x", "1"}, {"y", 1.5}, {"z", 1}};
  EXPECT_EQ(JsonNumber(doc, "x", "f").error(), "f: field 'x' must be a number");
  EXPECT_EQ(JsonInt(doc, "y", "f").error(), "f: field 'y' must be an integer");
  EXPECT_EQ(JsonString(doc, "z", "f").error(), "f: field 'z' must be a string");
  EXPECT_EQ(JsonBoolOr(doc, "z", false, "f").error(), "f: field 'z' must be true or false");
  EXPECT_EQ(JsonIntIn(doc, "x", 1, 2, "f").error(), "f: field 'x' must be an integer (got \"1\")");
}

TEST(JsonUtilTest, IntInBoundsNeverWrap) {
  const json doc = json::parse(R"({"max": 18446744073709551615, "neg": -3, "ok": 10})");
  EXPECT_EQ(*JsonIntIn(doc, "ok", 10, 10, "f"), 10);
  EXPECT_EQ(JsonIntIn(doc, "ok", 1, 9, "f").error(),
            "f: field 'ok' must be an integer between 1 and 9 (got 10)");
  EXPECT_FALSE(JsonIntIn(doc, "ok", 11, 20, "f").ok());
  EXPECT_EQ(JsonIntIn(doc, "max", 1, INT64_MAX, "f").error(),
            "f: field 'max' must be an integer between 1 and 9223372036854775807 (got "
            "18446744073709551615)");
  EXPECT_FALSE(JsonIntIn(doc, "neg", 0, 5, "f").ok());
  EXPECT_EQ(*JsonIntIn(doc, "neg", -5, 5, "f"), -3);
}

TEST(JsonUtilTest, DescribeJsonIsShortAndSafe) {
  EXPECT_EQ(DescribeJson(json::array({1, 2, 3})), "an array of 3");
  EXPECT_EQ(DescribeJson(json::object()), "an object");
  EXPECT_EQ(DescribeJson(json("abc")), "\"abc\"");
  EXPECT_EQ(DescribeJson(json(std::string(200, 'a'))).size(), 83u);  // 80 chars and "..."
  // Strings from MessagePack need not be UTF-8: the bad bytes are replaced, nothing throws.
  EXPECT_EQ(DescribeJson(json(std::string("a\xff\xfe"))), "\"a\xef\xbf\xbd\xef\xbf\xbd\"");
}

}  // namespace
}  // namespace duet
