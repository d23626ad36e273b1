// Safetensors checkpoints: a memory-mapped reader that validates the whole header before any
// tensor is handed out, a loader for sharded checkpoint directories, a writer (for generated
// test models), and the bit-exact bf16/fp16 <-> fp32 conversions the weights need.
// Format: 8-byte little-endian header length N, N bytes of JSON header, then the data section.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "models/dtype.h"

namespace duet::backend {

// Element types Duet computes with (models/dtype.h). Other safetensors dtypes (I64, F8_E4M3,
// F64, ...) are rejected by the reader with an error naming the dtype and the tensor.
using models::Dtype;
using models::DtypeBytes;
using models::DtypeFromName;
using models::DtypeName;

// The reference implementation's cap on the JSON header (a larger N is refused unread).
constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// One tensor inside a mapped (or caller-owned) file: no bytes are copied. `data` need not be
// aligned to the element size (a writer may place an F32 tensor after an odd-sized F16 one);
// ToFloat32 copies element by element and works either way.
struct TensorView {
  Dtype dtype = Dtype::kF32;
  std::vector<std::int64_t> shape;  // empty for a scalar
  const std::byte* data = nullptr;
  std::size_t bytes = 0;

  std::int64_t NumElements() const;
  bool IsAligned() const { return reinterpret_cast<std::uintptr_t>(data) % DtypeBytes(dtype) == 0; }
};

// "[2, 3]": for messages.
std::string ShapeString(const std::vector<std::int64_t>& shape);

// Bit-exact widening (bf16 and fp16 values are all representable in fp32, including
// subnormals, infinities and NaN payloads) and round-to-nearest-even narrowing (overflow goes
// to infinity, NaN stays a quiet NaN of the same sign).
float Bf16ToFloat(std::uint16_t bits);
float F16ToFloat(std::uint16_t bits);
std::uint16_t FloatToBf16(float value);
std::uint16_t FloatToF16(float value);

// Widens all of `tensor`'s elements into `out`, whose size must be tensor.NumElements().
void ToFloat32(const TensorView& tensor, std::span<float> out);
std::vector<float> ToFloat32(const TensorView& tensor);

// A validated safetensors file. Validation follows the reference implementation: header
// length within the file and <= 100 MB, header a JSON object starting with '{', every entry
// with a supported dtype, non-negative shape with an overflow-checked element count equal to
// its byte range, ranges inside the data section, and the ranges tiling the data section
// exactly (no overlaps, no holes, no trailing bytes).
class SafetensorsFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE); the mapping lives as long as any copy of the result
  // (and any LlamaWeights built on it). Nothing is read into memory up front.
  static Result<SafetensorsFile> Open(const std::string& path);
  // Parses a file image held by the caller, which must outlive the result (no copy is made).
  // `where` names the source in errors. Open uses the same path after mapping.
  static Result<SafetensorsFile> FromBuffer(std::span<const std::byte> bytes,
                                            const std::string& where);

  const std::string& where() const { return where_; }
  std::vector<std::string> TensorNames() const;  // sorted
  std::size_t size() const { return tensors_.size(); }
  const TensorView* Find(std::string_view name) const;  // nullptr when absent
  // The tensor, or "missing tensor NAME in FILE".
  Result<TensorView> Get(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The whole file image (the mapped region for Open).
  std::span<const std::byte> bytes() const { return bytes_; }

 private:
  class Mapping;
  std::string where_;
  std::shared_ptr<const Mapping> mapping_;  // null for FromBuffer
  std::span<const std::byte> bytes_;
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: the files model.safetensors.index.json's weight_map
// names when the index exists (each tensor checked to be in the file the index says), else
// every *.safetensors file in the directory. A tensor name in two files is an error.
class SafetensorsCheckpoint {
 public:
  static Result<SafetensorsCheckpoint> OpenDir(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<std::string> TensorNames() const;  // sorted
  const TensorView* Find(std::string_view name) const;
  // Which file holds `name` ("" when none).
  std::string FileOf(std::string_view name) const;

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::pair<TensorView, std::size_t>, std::less<>> tensors_;  // + file
};

// A tensor to write: its bytes are the raw little-endian elements.
struct TensorSpec {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<std::int64_t> shape;
};
struct NamedTensor {
  TensorSpec spec;
  std::vector<std::byte> data;
};

// Streams a safetensors file: the header (all tensors' names, dtypes and shapes) is written
// first, then each tensor's bytes in spec order, so a large model never has to be held in
// memory at once. The file appears at `path` (renamed from a temporary) only on Finish.
// The header is padded with spaces to a multiple of 8 bytes, as the reference writer does, so
// the data section starts 8-byte aligned.
class SafetensorsWriter {
 public:
  static Result<SafetensorsWriter> Create(const std::string& path, std::vector<TensorSpec> specs,
                                          const std::map<std::string, std::string>& metadata);
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept;
  ~SafetensorsWriter();  // an unfinished file is removed

  // The next tensor's bytes; the size must match its spec.
  Status Append(std::span<const std::byte> data);
  Status Finish();

 private:
  SafetensorsWriter() = default;
  std::string path_;
  std::string temp_path_;
  std::FILE* file_ = nullptr;
  std::vector<TensorSpec> specs_;
  std::vector<std::size_t> sizes_bytes_;
  std::size_t next_ = 0;
};

Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace duet::backend
