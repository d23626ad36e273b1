// Tests for the safetensors reader, writer and checkpoint directories: round trips, a clear
// error (never a crash) for each kind of broken file, proof that tensors are views into the
// file mapping rather than copies, and the bf16/fp16 conversions on every special value.
#include "backend/model/safetensors.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "tests/model/temp_dir.h"

namespace duet::backend {
namespace {

// A file image: 8-byte little-endian length (the header's own unless given), header, data.
std::string Image(const std::string& header, const std::string& data = "",
                  std::optional<std::uint64_t> length = std::nullopt) {
  const std::uint64_t n = length.value_or(header.size());
  std::string image(8, '\0');
  for (int i = 0; i < 8; ++i) image[i] = char((n >> (8 * i)) & 0xff);
  return image + header + data;
}

std::span<const std::byte> AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// Expects FromBuffer to fail with a message holding every one of `parts`.
void ExpectBad(const std::string& image, std::initializer_list<std::string> parts) {
  Result<SafetensorsFile> file = SafetensorsFile::FromBuffer(AsBytes(image), "bad.safetensors");
  ASSERT_FALSE(file.ok()) << "accepted: " << image.substr(std::min<size_t>(8, image.size()));
  EXPECT_EQ(file.error().rfind("bad.safetensors", 0), 0u) << file.error();
  for (const std::string& part : parts) {
    EXPECT_NE(file.error().find(part), std::string::npos) << file.error() << " lacks " << part;
  }
}

std::string F32Header(const std::string& name, const std::string& shape, int begin, int end) {
  return "{\"" + name + "\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}}";
}

std::vector<std::byte> FloatBytes(const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::vector<std::byte> HalfBytes(const std::vector<std::uint16_t>& values) {
  std::vector<std::byte> bytes(values.size() * 2);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// ---- conversions ----

std::uint32_t Bits(float f) { return std::bit_cast<std::uint32_t>(f); }

TEST(ConversionTest, Bf16SpecialValues) {
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bits(Bf16ToFloat(0x8000)), 0x80000000u);  // -0
  EXPECT_EQ(Bf16ToFloat(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bf16ToFloat(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bits(Bf16ToFloat(0x7fc1)), 0x7fc10000u);  // NaN payload kept
  EXPECT_EQ(Bits(Bf16ToFloat(0x0001)), 0x00010000u);  // smallest subnormal, 2^-133
  EXPECT_EQ(Bf16ToFloat(0x0001), std::ldexp(1.0f, -133));
  EXPECT_EQ(Bf16ToFloat(0xc040), -3.0f);
}

TEST(ConversionTest, F16SpecialValues) {
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(Bits(F16ToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));         // smallest subnormal
  EXPECT_EQ(F16ToFloat(0x03ff), 1023 * std::ldexp(1.0f, -24));  // largest subnormal
  EXPECT_EQ(F16ToFloat(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(F16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bits(F16ToFloat(0x7e01)), 0x7fc02000u);  // quiet NaN, payload kept
  EXPECT_EQ(Bits(F16ToFloat(0x7c01)), 0x7f802000u);  // signalling NaN stays NaN
  EXPECT_EQ(F16ToFloat(0x3555), 0x1.554p-2f);        // ~1/3
}

TEST(ConversionTest, EveryHalfPatternRoundTrips) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const std::uint16_t bits = std::uint16_t(h);
    const float bf = Bf16ToFloat(bits);
    const float f16 = F16ToFloat(bits);
    if (std::isnan(bf)) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(bf))));
    } else {
      EXPECT_EQ(FloatToBf16(bf), bits) << h;
    }
    if (std::isnan(f16)) {
      EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(f16)))) << h;
      EXPECT_EQ(FloatToF16(f16) & 0x8000, bits & 0x8000);
    } else {
      EXPECT_EQ(FloatToF16(f16), bits) << h;
    }
  }
}

TEST(ConversionTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3f80);                     // tie: down to even 1.0
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);                 // tie: up to even
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);          // above the tie
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  // A NaN whose payload sits only in the dropped bits must not become infinity.
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x00008000u)), 0x0000);  // tiny tie to even zero
}

TEST(ConversionTest, F16RoundsToNearestEven) {
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToF16(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);  // the tie above the largest value: infinity
  EXPECT_EQ(FloatToF16(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToF16(1.0f + 0x1p-11f), 0x3c00);      // tie: even
  EXPECT_EQ(FloatToF16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie: even
  EXPECT_EQ(FloatToF16(0x1p-25f), 0x0000);             // half the smallest subnormal: even 0
  EXPECT_EQ(FloatToF16(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(FloatToF16(3 * 0x1p-25f), 0x0002);  // tie between 1 and 2 units: 2
  EXPECT_EQ(FloatToF16(0x1p-26f), 0x0000);
  EXPECT_EQ(FloatToF16(-0x1p-30f), 0x8000);               // keeps the sign of zero
  EXPECT_EQ(FloatToF16(0x1p-14f - 0x1p-26f), 0x0400);     // rounds up into the normals
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -140)), 0x0000);  // an fp32 subnormal
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(std::bit_cast<float>(0x7f800001u)))));
}

TEST(ConversionTest, F16IsNearestOnRandomValues) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    // Random bit patterns with exponents across the fp16 range (and a bit beyond).
    const std::uint32_t exponent = 100 + std::uint32_t(rng() % 44);
    const std::uint32_t bits =
        (std::uint32_t(rng() & 1) << 31) | (exponent << 23) | std::uint32_t(rng() & 0x7fffff);
    const float x = std::bit_cast<float>(bits);
    const std::uint16_t h = FloatToF16(x);
    const double got = F16ToFloat(h);
    if (std::isinf(got)) {
      EXPECT_GE(std::abs(double(x)), 65520.0);
      continue;
    }
    // No neighbouring fp16 value is closer, and ties went to the even mantissa.
    for (int step : {-1, 1}) {
      const std::uint16_t other = std::uint16_t((h & 0x7fff) + step) | (h & 0x8000);
      if ((h & 0x7fff) == 0 && step < 0) continue;
      const double neighbour = F16ToFloat(other);
      if (std::isinf(neighbour)) continue;
      const double d_got = std::abs(got - double(x));
      const double d_other = std::abs(neighbour - double(x));
      EXPECT_LE(d_got, d_other) << x;
      if (d_got == d_other) {
        EXPECT_EQ(h & 1, 0) << x;
      }
    }
  }
}

// ---- reading and writing ----

TEST(SafetensorsTest, WriteThenReadRoundTrips) {
  TempDir tmp;
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-40f};
  const std::vector<std::uint16_t> bf16 = {0x3f80, 0x7f80, 0x0001};
  const std::vector<std::uint16_t> f16 = {0x3c00, 0x0001, 0xfc00, 0x7bff};
  std::vector<NamedTensor> tensors = {
      {{"a.f32", Dtype::kF32, {2, 3}}, FloatBytes(f32)},
      {{"b.bf16", Dtype::kBF16, {3}}, HalfBytes(bf16)},
      {{"c.f16", Dtype::kF16, {2, 1, 2}}, HalfBytes(f16)},
      {{"d.scalar", Dtype::kF32, {}}, FloatBytes({42.0f})},
      {{"e.empty", Dtype::kF32, {0, 5}}, {}},
  };
  const std::string path = tmp.File("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));

  Result<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.error();
  EXPECT_EQ(file->TensorNames(),
            (std::vector<std::string>{"a.f32", "b.bf16", "c.f16", "d.scalar", "e.empty"}));
  EXPECT_EQ(file->metadata().at("format"), "pt");
  // The header is space-padded so the data section starts 8-byte aligned.
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file->bytes().data(), 8);
  EXPECT_EQ(header_bytes % 8, 0u);

  const TensorView* a = file->Find("a.f32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, Dtype::kF32);
  EXPECT_EQ(a->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a->NumElements(), 6);
  EXPECT_TRUE(a->IsAligned());
  const std::vector<float> a_values = ToFloat32(*a);
  EXPECT_EQ(std::memcmp(a_values.data(), f32.data(), 24), 0);  // bit exact, -0 and subnormal too

  const std::vector<float> b_values = ToFloat32(*file->Find("b.bf16"));
  EXPECT_EQ(b_values[0], 1.0f);
  EXPECT_TRUE(std::isinf(b_values[1]));
  EXPECT_EQ(b_values[2], std::ldexp(1.0f, -133));
  const TensorView* c = file->Find("c.f16");
  EXPECT_EQ(c->shape, (std::vector<std::int64_t>{2, 1, 2}));
  EXPECT_EQ(ToFloat32(*c), (std::vector<float>{1.0f, std::ldexp(1.0f, -24),
                                               -std::numeric_limits<float>::infinity(), 65504.0f}));
  EXPECT_EQ(file->Find("d.scalar")->NumElements(), 1);
  EXPECT_EQ(ToFloat32(*file->Find("d.scalar"))[0], 42.0f);
  EXPECT_EQ(file->Find("e.empty")->bytes, 0u);
  EXPECT_EQ(file->Find("e.empty")->NumElements(), 0);
  EXPECT_EQ(file->Find("nope"), nullptr);
  Result<TensorView> missing = file->Get("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error(), "missing tensor nope in " + path);
}

TEST(SafetensorsTest, ReadsUnalignedTensors) {
  // An odd-sized F16 tensor first leaves the F32 tensor after it at an odd offset.
  std::string header = R"({"h":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},)"
                       R"("f":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})";
  header.append((8 - header.size() % 8) % 8, ' ');  // data section 8-aligned in the image
  std::string data("\x00\x3c", 2);
  const float value = 2.5f;
  data.append(reinterpret_cast<const char*>(&value), 4);
  const std::string image = Image(header, data);  // heap buffer: at least 8-aligned
  Result<SafetensorsFile> file = SafetensorsFile::FromBuffer(AsBytes(image), "mem");
  ASSERT_TRUE(file.ok()) << file.error();
  EXPECT_TRUE(file->Find("h")->IsAligned());
  EXPECT_FALSE(file->Find("f")->IsAligned());
  EXPECT_EQ(ToFloat32(*file->Find("h"))[0], 1.0f);
  EXPECT_EQ(ToFloat32(*file->Find("f"))[0], 2.5f);
}

TEST(SafetensorsTest, ShortFilesGiveClearErrors) {
  ExpectBad("", {"0 bytes", "shorter than the 8-byte header length"});
  ExpectBad("abcde", {"5 bytes", "shorter than the 8-byte"});
  ExpectBad(Image("{}", "", 1000), {"header length 1000", "runs past the end"});
  ExpectBad(Image("{}", "", 200'000'000), {"200000000", "100000000-byte limit"});
  ExpectBad(Image("{}", "", std::numeric_limits<std::uint64_t>::max()), {"limit"});
  TempDir tmp;
  for (const char* bytes : {"", "\x01\x02\x03"}) {
    const std::string path = tmp.Write("short.safetensors", bytes);
    Result<SafetensorsFile> file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok());
    EXPECT_NE(file.error().find(path), std::string::npos) << file.error();
    EXPECT_NE(file.error().find("shorter than the 8-byte"), std::string::npos) << file.error();
  }
  const std::string truncated = tmp.Write("trunc.safetensors", Image("{}", "", 64));
  Result<SafetensorsFile> file = SafetensorsFile::Open(truncated);
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.error().find("runs past the end"), std::string::npos) << file.error();
  EXPECT_FALSE(SafetensorsFile::Open(tmp.File("absent.safetensors")).ok());
  Result<SafetensorsFile> dir = SafetensorsFile::Open(tmp.path());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.error().find("not a regular file"), std::string::npos);
}

TEST(SafetensorsTest, CorruptHeadersGiveClearErrors) {
  ExpectBad(Image(R"({"a": {"dtype": )"), {"not valid JSON"});
  ExpectBad(Image("[1, 2]"), {"does not start with '{'"});
  ExpectBad(Image(""), {"does not start with '{'"});
  ExpectBad(Image("{} x"), {"not valid JSON"});
  ExpectBad(Image("{\"a\": 5}"), {"tensor 'a' must be an object"});
  ExpectBad(Image(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", "abcd"), {"'dtype'"});
  ExpectBad(Image(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "abcd"), {"'shape'"});
  ExpectBad(Image(R"({"a":{"dtype":"F32","shape":[1]}})", "abcd"), {"'data_offsets'"});
  ExpectBad(Image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "abcd"),
            {"'data_offsets'"});
  ExpectBad(Image(F32Header("a", "[-1]", 0, 4), "abcd"), {"non-negative"});
  ExpectBad(Image(F32Header("a", "[1.5]", 0, 4), "abcd"), {"non-negative"});
  ExpectBad(Image(F32Header("a", "[[[[1]]]]", 0, 4), "abcd"), {"non-negative", "array"});
  ExpectBad(Image(R"({"__metadata__":{"format":1}})"), {"__metadata__", "string"});
  ExpectBad(Image(R"({"__metadata__":[]})"), {"__metadata__", "object"});
  // Trailing space padding, as the reference writer emits, is fine.
  const std::string padded = Image("{}      ");
  EXPECT_TRUE(SafetensorsFile::FromBuffer(AsBytes(padded), "x").ok());
}

TEST(SafetensorsTest, UnsupportedDtypesAreNamed) {
  for (const char* dtype : {"I64", "F8_E4M3", "F64", "BOOL", "Q4"}) {
    const std::string header =
        std::string(R"({"w":{"dtype":")") + dtype + R"(","shape":[1],"data_offsets":[0,8]}})";
    ExpectBad(Image(header, "abcdefgh"), {"unsupported dtype", dtype, "for tensor 'w'"});
  }
}

TEST(SafetensorsTest, BadOffsetsGiveClearErrors) {
  // Beyond the data section.
  ExpectBad(Image(F32Header("a", "[2]", 0, 8), "abcd"), {"tensor 'a'", "beyond the data section"});
  ExpectBad(
      Image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}})", "abcd"),
      {"tensor 'a'", "beyond the data section"});
  ExpectBad(Image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "abcd"),
            {"tensor 'a'", "data_offsets"});
  // Element count does not match the byte range.
  ExpectBad(Image(F32Header("a", "[3]", 0, 8), "abcdefgh"),
            {"tensor 'a'", "needs 12 bytes", "hold 8"});
  // End before begin.
  ExpectBad(Image(F32Header("a", "[1]", 8, 4), "abcdefgh"), {"end before"});
  // Overlap.
  ExpectBad(Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  "abcdefghijkl"),
            {"'a' and 'b' overlap"});
  // Two tensors on the same bytes.
  ExpectBad(Image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                  "abcdefgh"),
            {"overlap"});
  // A hole before a tensor, and bytes after the last one.
  ExpectBad(Image(F32Header("a", "[1]", 4, 8), "abcdefgh"), {"unused bytes [0, 4)"});
  ExpectBad(Image(F32Header("a", "[1]", 0, 4), "abcdefgh"), {"4 bytes after the last tensor"});
  // Element counts that overflow 64 bits, or whose byte size does.
  ExpectBad(Image(F32Header("a", "[4294967296, 4294967296, 4294967296]", 0, 4), "abcd"),
            {"overflows"});
  ExpectBad(Image(F32Header("a", "[4611686018427387904, 2, 0]", 0, 0)), {"overflows"});
  ExpectBad(Image(F32Header("a", "[4611686018427387904]", 0, 4), "abcd"), {"overflows"});
}

TEST(SafetensorsTest, ViewsPointIntoTheFileMapping) {
  TempDir tmp;
  // 32 MiB of F32 so that a copy would show in the resident anonymous memory.
  constexpr std::size_t kCount = std::size_t(8) << 20;
  {
    std::vector<float> values(kCount);
    for (std::size_t i = 0; i < kCount; ++i) values[i] = float(i % 1000);
    std::vector<NamedTensor> tensors = {{{"big", Dtype::kF32, {std::int64_t(kCount)}}, {}}};
    tensors[0].data = FloatBytes(values);
    ASSERT_TRUE(WriteSafetensors(tmp.File("big.safetensors"), tensors).ok());
  }
  auto rss_anon_kib = [] {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("RssAnon:", 0) == 0) return std::stol(line.substr(8));
    }
    return -1L;
  };
  const long anon_before = rss_anon_kib();
  Result<SafetensorsFile> file = SafetensorsFile::Open(tmp.File("big.safetensors"));
  ASSERT_TRUE(file.ok()) << file.error();
  const TensorView* big = file->Find("big");
  ASSERT_NE(big, nullptr);
  // Touch every page of the tensor.
  double sum = 0;
  for (std::size_t i = 0; i < kCount; i += 1024) {
    float v;
    std::memcpy(&v, big->data + 4 * i, 4);
    sum += v;
  }
  EXPECT_GT(sum, 0);
  const long anon_after = rss_anon_kib();
  if (anon_before >= 0 && anon_after >= 0) {
    EXPECT_LT(anon_after - anon_before, 8 * 1024) << "KiB of anonymous memory grew";
  }
  // The view lies inside the file image, and the image is a mapping of the file itself.
  const auto image = file->bytes();
  EXPECT_GE(big->data, image.data());
  EXPECT_LE(big->data + big->bytes, image.data() + image.size());
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool found = false;
  const auto address = reinterpret_cast<std::uintptr_t>(big->data);
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, device, inode, path;
    fields >> range >> perms >> offset >> device >> inode >> path;
    const std::size_t dash = range.find('-');
    const std::uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
    const std::uintptr_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (address >= lo && address < hi) {
      found = true;
      EXPECT_EQ(path, tmp.File("big.safetensors")) << line;
      EXPECT_EQ(perms.substr(0, 2), "r-") << line;  // read-only
      EXPECT_EQ(perms[3], 'p') << line;             // private
    }
  }
  EXPECT_TRUE(found);
}

TEST(SafetensorsTest, WriterRejectsMisuse) {
  TempDir tmp;
  const std::string path = tmp.File("w.safetensors");
  EXPECT_FALSE(
      SafetensorsWriter::Create(path, {{"a", Dtype::kF32, {1}}, {"a", Dtype::kF32, {1}}}, {}).ok());
  EXPECT_FALSE(SafetensorsWriter::Create(path, {{"__metadata__", Dtype::kF32, {1}}}, {}).ok());
  EXPECT_FALSE(SafetensorsWriter::Create(path, {{"a", Dtype::kF32, {-1}}}, {}).ok());
  EXPECT_FALSE(SafetensorsWriter::Create(path, {{"\xff", Dtype::kF32, {1}}}, {}).ok());
  {
    Result<SafetensorsWriter> writer =
        SafetensorsWriter::Create(path, {{"a", Dtype::kF32, {2}}, {"b", Dtype::kBF16, {1}}}, {});
    ASSERT_TRUE(writer.ok()) << writer.error();
    EXPECT_FALSE(writer->Append(FloatBytes({1.0f})).ok());  // wrong size
    EXPECT_TRUE(writer->Append(FloatBytes({1.0f, 2.0f})).ok());
    EXPECT_FALSE(writer->Finish().ok());  // 'b' never written
  }
  // An unfinished writer leaves nothing behind.
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
}

// ---- checkpoint directories ----

void WriteOne(const std::string& path, const std::string& name, float value) {
  ASSERT_TRUE(WriteSafetensors(path, {{{name, Dtype::kF32, {1}}, FloatBytes({value})}}).ok());
}

TEST(SafetensorsCheckpointTest, ReadsShardsThroughTheIndex) {
  TempDir tmp;
  WriteOne(tmp.File("model-00001-of-00002.safetensors"), "x", 1.0f);
  WriteOne(tmp.File("model-00002-of-00002.safetensors"), "y", 2.0f);
  WriteOne(tmp.File("unrelated.safetensors"), "z", 3.0f);  // not in the index: not read
  tmp.Write("model.safetensors.index.json",
            R"({"metadata": {"total_size": 8}, "weight_map": {
                "x": "model-00001-of-00002.safetensors",
                "y": "model-00002-of-00002.safetensors"}})");
  Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::OpenDir(tmp.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.error();
  EXPECT_EQ(ckpt->TensorNames(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(ckpt->files().size(), 2u);
  EXPECT_EQ(ToFloat32(*ckpt->Find("y"))[0], 2.0f);
  EXPECT_EQ(ckpt->FileOf("y"), tmp.File("model-00002-of-00002.safetensors"));
  EXPECT_EQ(ckpt->Find("z"), nullptr);
}

TEST(SafetensorsCheckpointTest, IndexErrorsAreClear) {
  TempDir tmp;
  WriteOne(tmp.File("a.safetensors"), "x", 1.0f);
  WriteOne(tmp.File("b.safetensors"), "y", 2.0f);
  auto expect_error = [&](const std::string& index, const std::string& part) {
    tmp.Write("model.safetensors.index.json", index);
    Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::OpenDir(tmp.path());
    ASSERT_FALSE(ckpt.ok()) << index;
    EXPECT_NE(ckpt.error().find(part), std::string::npos) << ckpt.error();
  };
  expect_error(R"({"weight_map": {"x": "b.safetensors", "y": "b.safetensors"}})",
               "weight_map puts tensor 'x' in b.safetensors, but no file holds it");
  expect_error(R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors",
                                   "zz": "b.safetensors"}})",
               "puts tensor 'y' in a.safetensors, but it is in " + tmp.File("b.safetensors"));
  expect_error(R"({"weight_map": {"x": "../a.safetensors"}})", "not a file in the same");
  expect_error(R"({"weight_map": {"x": "missing.safetensors"}})", "missing.safetensors");
  expect_error(R"({"weight_map": 3})", "weight_map");
  expect_error(R"({"weight_map": {"x": 3}})", "file name");
  expect_error("{", "invalid JSON");
}

TEST(SafetensorsCheckpointTest, WithoutIndexReadsEveryFile) {
  TempDir tmp;
  WriteOne(tmp.File("a.safetensors"), "x", 1.0f);
  WriteOne(tmp.File("b.safetensors"), "y", 2.0f);
  tmp.Write("notes.txt", "not a tensor file");
  Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::OpenDir(tmp.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.error();
  EXPECT_EQ(ckpt->TensorNames(), (std::vector<std::string>{"x", "y"}));
  WriteOne(tmp.File("c.safetensors"), "x", 5.0f);
  ckpt = SafetensorsCheckpoint::OpenDir(tmp.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().find("tensor 'x' is in both"), std::string::npos) << ckpt.error();

  TempDir empty_holder;
  const std::string empty = empty_holder.File("empty");
  std::filesystem::create_directories(empty);
  Result<SafetensorsCheckpoint> none = SafetensorsCheckpoint::OpenDir(empty);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().find("no model.safetensors.index.json"), std::string::npos);
  EXPECT_FALSE(SafetensorsCheckpoint::OpenDir(empty_holder.File("absent")).ok());
  // A broken shard names itself.
  tmp.Write("d.safetensors", "xyz");
  ckpt = SafetensorsCheckpoint::OpenDir(tmp.path());
  ASSERT_FALSE(ckpt.ok());
}

}  // namespace
}  // namespace duet::backend
