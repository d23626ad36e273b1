// Safetensors reading (mmap + full header validation), sharded checkpoint directories, the
// streaming writer, and the fp32 <-> bf16/fp16 conversions. The header parser is the only
// code that sees untrusted bytes; it is fuzzed through SafetensorsFile::FromBuffer.
#include "backend/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "common/json_util.h"

namespace duet::backend {
namespace {

// The format stores little-endian elements and views hand them out unconverted.
static_assert(std::endian::native == std::endian::little, "Duet reads safetensors in place");

using nlohmann::json;

// The dtypes Duet computes with. Every other name, whether a real safetensors dtype (I64,
// F8_E4M3, ...) or garbage, is reported as an unsupported dtype of the tensor.
std::string SupportedDtypes() { return "BF16, F16, F32"; }

std::string Quote(std::string_view s) {
  std::string quoted;
  quoted.reserve(s.size() + 2);
  quoted.append(1, '\'').append(s).append(1, '\'');
  return quoted;
}

std::uint64_t ReadLittleEndian64(const std::byte* p) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | std::to_integer<std::uint64_t>(p[i]);
  return value;
}

struct ParsedHeader {
  std::map<std::string, TensorView, std::less<>> tensors;
  std::map<std::string, std::string> metadata;
};

// A non-negative JSON integer, or nullopt.
std::optional<std::uint64_t> Unsigned(const json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;
  return value.get<std::uint64_t>();
}

// Parses and validates the header of a file image; views point into `bytes`.
Result<ParsedHeader> ParseHeader(std::span<const std::byte> bytes, const std::string& where) {
  if (bytes.size() < 8) {
    return Status::Error(where + ": file is " + std::to_string(bytes.size()) +
                         " bytes, shorter than the 8-byte header length");
  }
  const std::uint64_t header_bytes = ReadLittleEndian64(bytes.data());
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    return Status::Error(where + ": header length " + std::to_string(header_bytes) +
                         " exceeds the 100000000-byte limit");
  }
  if (header_bytes > bytes.size() - 8) {
    return Status::Error(where + ": header length " + std::to_string(header_bytes) +
                         " runs past the end of the file (" + std::to_string(bytes.size()) +
                         " bytes)");
  }
  const char* header = reinterpret_cast<const char*>(bytes.data() + 8);
  if (header_bytes == 0 || header[0] != '{') {
    return Status::Error(where + ": header does not start with '{'");
  }
  json doc;
  try {
    doc = json::parse(header, header + header_bytes);  // trailing space padding is allowed
  } catch (const json::exception& e) {
    return Status::Error(where + ": header is not valid JSON: " + e.what());
  }
  if (!doc.is_object()) return Status::Error(where + ": header must be a JSON object");

  const std::span<const std::byte> data = bytes.subspan(8 + header_bytes);
  ParsedHeader parsed;
  struct Range {
    std::uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return Status::Error(where + ": __metadata__ must be an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return Status::Error(where + ": __metadata__ value for " + Quote(m.key()) +
                               " must be a string");
        }
        parsed.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string at = where + ": tensor " + Quote(name);
    if (!entry.is_object()) return Status::Error(at + " must be an object");
    auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return FieldError(at, "dtype", "must be a string");
    }
    const std::string dtype_name = dtype_it->get<std::string>();
    const std::optional<Dtype> dtype = DtypeFromName(dtype_name);
    if (!dtype) {
      return Status::Error(where + ": unsupported dtype " + DescribeJson(*dtype_it) +
                           " for tensor " + Quote(name) + " (supported: " + SupportedDtypes() +
                           ")");
    }
    auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return FieldError(at, "shape", "must be a list of non-negative integers");
    }
    TensorView view;
    view.dtype = *dtype;
    // The element count is checked for overflow dimension by dimension, left to right, as the
    // reference does; every prefix product stays within int64 so NumElements is safe too.
    std::uint64_t elements = 1;
    for (const json& dim : *shape_it) {
      const std::optional<std::uint64_t> d = Unsigned(dim);
      if (!d) {
        return Status::Error(at + ": shape entries must be non-negative integers (got " +
                             DescribeJson(dim) + ")");
      }
      if (__builtin_mul_overflow(elements, *d, &elements) ||
          elements > std::uint64_t(std::numeric_limits<std::int64_t>::max()) ||
          *d > std::uint64_t(std::numeric_limits<std::int64_t>::max())) {
        return Status::Error(at + ": element count overflows at shape dimension " +
                             std::to_string(view.shape.size()));
      }
      view.shape.push_back(std::int64_t(*d));
    }
    std::uint64_t expected_bytes = 0;
    if (__builtin_mul_overflow(elements, std::uint64_t(DtypeBytes(*dtype)), &expected_bytes)) {
      return Status::Error(at + ": byte size of shape " + shape_it->dump() + " overflows");
    }
    auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !Unsigned((*offsets_it)[0]) || !Unsigned((*offsets_it)[1])) {
      return FieldError(at, "data_offsets", "must be [begin, end] (non-negative)");
    }
    const std::uint64_t begin = *Unsigned((*offsets_it)[0]);
    const std::uint64_t end = *Unsigned((*offsets_it)[1]);
    if (begin > end) {
      return Status::Error(at + ": data_offsets " + offsets_it->dump() + " end before they begin");
    }
    if (end > data.size()) {
      return Status::Error(at + ": data_offsets " + offsets_it->dump() +
                           " lie beyond the data section (" + std::to_string(data.size()) +
                           " bytes)");
    }
    if (end - begin != expected_bytes) {
      return Status::Error(at + ": shape " + shape_it->dump() + " of " + dtype_name + " needs " +
                           std::to_string(expected_bytes) + " bytes but data_offsets " +
                           offsets_it->dump() + " hold " + std::to_string(end - begin));
    }
    view.data = data.data() + begin;
    view.bytes = std::size_t(end - begin);
    auto [inserted, fresh] = parsed.tensors.emplace(name, std::move(view));
    ranges.push_back({begin, end, &inserted->first});
  }

  // The ranges must tile the data section: sorted by position, each starts where the last
  // ended (zero-size tensors sit at a boundary).
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  std::uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const Range& range : ranges) {
    if (range.begin < covered) {
      return Status::Error(where + ": tensors " + Quote(*previous) + " and " + Quote(*range.name) +
                           " overlap in the data section");
    }
    if (range.begin > covered) {
      return Status::Error(where + ": data section has unused bytes [" + std::to_string(covered) +
                           ", " + std::to_string(range.begin) + ") before tensor " +
                           Quote(*range.name));
    }
    covered = range.end;
    previous = range.name;
  }
  if (covered != data.size()) {
    return Status::Error(where + ": data section has " + std::to_string(data.size() - covered) +
                         " bytes after the last tensor");
  }
  return parsed;
}

}  // namespace

// ---- views and conversions ----

std::int64_t TensorView::NumElements() const {
  std::uint64_t n = 1;  // unsigned: a hand-built view with a silly shape must not be UB
  for (std::int64_t d : shape) n *= std::uint64_t(d);
  return std::int64_t(n);
}

std::string ShapeString(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

float Bf16ToFloat(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

float F16ToFloat(std::uint16_t bits) {
  const std::uint32_t sign = std::uint32_t(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {  // infinity, or NaN with its payload kept
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32 (a 10-bit integer times a power of 2).
    const float magnitude = float(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  // Rebias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

std::uint16_t FloatToBf16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return std::uint16_t((bits >> 16) | 0x0040u);  // NaN: keep sign and top payload, quiet
  }
  // Round to nearest, ties to even: add just under half an ulp plus the lowest kept bit.
  const std::uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return std::uint16_t(rounded >> 16);
}

std::uint16_t FloatToF16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint16_t sign = std::uint16_t((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: quiet, keep the top payload bits
    return std::uint16_t(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // >= 65520: infinity
  const std::uint32_t exponent = magnitude >> 23;
  if (exponent < 113) {               // below 2^-14: an fp16 subnormal (or zero)
    if (exponent < 102) return sign;  // below 2^-25: rounds to zero
    // The value in units of 2^-24 is mantissa * 2^(exponent - 126).
    const std::uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;  // 14..24
    std::uint32_t q = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;  // may carry into the smallest normal
    return std::uint16_t(sign | q);
  }
  // Normal: rebias 127 -> 15 and drop 13 mantissa bits, rounding to nearest even; a carry out
  // of the mantissa correctly bumps the exponent.
  std::uint32_t h = (magnitude >> 13) - (112u << 10);
  const std::uint32_t rest = magnitude & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return std::uint16_t(sign | h);
}

void ToFloat32(const TensorView& tensor, std::span<float> out) {
  DUET_CHECK(std::int64_t(out.size()) == tensor.NumElements());
  DUET_CHECK(out.size() * DtypeBytes(tensor.dtype) == tensor.bytes);
  if (out.empty()) return;  // memcpy with the null data of an empty vector is undefined
  if (tensor.dtype == Dtype::kF32) {
    std::memcpy(out.data(), tensor.data, tensor.bytes);
    return;
  }
  const bool bf16 = tensor.dtype == Dtype::kBF16;
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, tensor.data + 2 * i, 2);  // the data may be unaligned
    out[i] = bf16 ? Bf16ToFloat(bits) : F16ToFloat(bits);
  }
}

std::vector<float> ToFloat32(const TensorView& tensor) {
  std::vector<float> out(std::size_t(tensor.NumElements()));
  ToFloat32(tensor, out);
  return out;
}

// ---- SafetensorsFile ----

class SafetensorsFile::Mapping {
 public:
  Mapping(void* address, std::size_t size) : address_(address), size_(size) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { ::munmap(address_, size_); }
  std::span<const std::byte> bytes() const {
    return {static_cast<const std::byte*>(address_), size_};
  }

 private:
  void* address_;
  std::size_t size_;
};

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error(path + ": cannot open: " + std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::Error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return Status::Error(path + ": not a regular file");
  }
  const std::size_t size = std::size_t(info.st_size);
  if (size < 8) {  // mmap of an empty file fails; say what is wrong instead
    ::close(fd);
    return Status::Error(path + ": file is " + std::to_string(size) +
                         " bytes, shorter than the 8-byte header length");
  }
  // Read-only private mapping: pages come from the page cache on first touch and are shared
  // with every other process mapping the file; nothing is copied here.
  void* address = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (address == MAP_FAILED) return Status::Error(path + ": cannot mmap: " + std::strerror(err));
  auto mapping = std::make_shared<const Mapping>(address, size);
  Result<SafetensorsFile> file = FromBuffer(mapping->bytes(), path);
  if (!file.ok()) return file.status();
  file->mapping_ = std::move(mapping);
  return file;
}

Result<SafetensorsFile> SafetensorsFile::FromBuffer(std::span<const std::byte> bytes,
                                                    const std::string& where) {
  Result<ParsedHeader> parsed = ParseHeader(bytes, where);
  if (!parsed.ok()) return parsed.status();
  SafetensorsFile file;
  file.where_ = where;
  file.bytes_ = bytes;
  file.tensors_ = std::move(parsed->tensors);
  file.metadata_ = std::move(parsed->metadata);
  return file;
}

std::vector<std::string> SafetensorsFile::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<TensorView> SafetensorsFile::Get(std::string_view name) const {
  const TensorView* view = Find(name);
  if (view == nullptr)
    return Status::Error("missing tensor " + std::string(name) + " in " + where_);
  return *view;
}

// ---- SafetensorsCheckpoint ----

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::OpenDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::Error(dir + ": not a directory");
  SafetensorsCheckpoint checkpoint;
  checkpoint.dir_ = dir;

  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  std::map<std::string, std::string> weight_map;  // tensor -> file, when indexed
  std::vector<std::string> file_names;
  if (fs::exists(index_path, ec)) {
    Result<json> index = ReadJsonFile(index_path);
    if (!index.ok()) return index.status();
    auto map_it = index->find("weight_map");
    if (map_it == index->end() || !map_it->is_object()) {
      return FieldError(index_path, "weight_map", "must be an object");
    }
    std::set<std::string> distinct;
    for (auto it = map_it->begin(); it != map_it->end(); ++it) {
      if (!it.value().is_string()) {
        return Status::Error(index_path + ": weight_map entry " + Quote(it.key()) +
                             " must be a file name");
      }
      const std::string file = it.value().get<std::string>();
      // Shards sit beside the index; a path elsewhere is refused rather than followed.
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos) {
        return Status::Error(index_path + ": weight_map entry " + Quote(it.key()) + " names " +
                             Quote(file) + ", not a file in the same directory");
      }
      weight_map[it.key()] = file;
      distinct.insert(file);
    }
    file_names.assign(distinct.begin(), distinct.end());
  } else {
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::path& p = it->path();
      if (p.extension() == ".safetensors" && it->is_regular_file(ec)) {
        file_names.push_back(p.filename().string());
      }
    }
    if (ec) return Status::Error(dir + ": cannot list: " + ec.message());
    std::sort(file_names.begin(), file_names.end());
    if (file_names.empty()) {
      return Status::Error(dir + ": no model.safetensors.index.json and no *.safetensors file");
    }
  }

  for (const std::string& name : file_names) {
    Result<SafetensorsFile> file = SafetensorsFile::Open((fs::path(dir) / name).string());
    if (!file.ok()) return file.status();
    const std::size_t file_index = checkpoint.files_.size();
    for (const std::string& tensor : file->TensorNames()) {
      auto [it, fresh] =
          checkpoint.tensors_.emplace(tensor, std::make_pair(*file->Find(tensor), file_index));
      if (!fresh) {
        return Status::Error(dir + ": tensor " + Quote(tensor) + " is in both " +
                             checkpoint.files_[it->second.second].where() + " and " +
                             file->where());
      }
    }
    checkpoint.files_.push_back(std::move(*file));
  }
  for (const auto& [tensor, file] : weight_map) {
    const std::string actual = checkpoint.FileOf(tensor);
    if (actual != (fs::path(dir) / file).string()) {
      return Status::Error(index_path + ": weight_map puts tensor " + Quote(tensor) + " in " +
                           file + ", but " +
                           (actual.empty() ? "no file holds it" : "it is in " + actual));
    }
  }
  return checkpoint;
}

std::vector<std::string> SafetensorsCheckpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

const TensorView* SafetensorsCheckpoint::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.first;
}

std::string SafetensorsCheckpoint::FileOf(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? std::string() : files_[it->second.second].where();
}

// ---- writing ----

Result<SafetensorsWriter> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorSpec> specs,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  std::vector<std::size_t> sizes_bytes;
  std::uint64_t offset = 0;
  for (const TensorSpec& spec : specs) {
    if (spec.name == "__metadata__" || !seen.insert(spec.name).second) {
      return Status::Error(path + ": tensor name " + Quote(spec.name) + " is reserved or repeated");
    }
    std::uint64_t bytes = DtypeBytes(spec.dtype);
    for (std::int64_t d : spec.shape) {
      if (d < 0 || __builtin_mul_overflow(bytes, std::uint64_t(d), &bytes)) {
        return Status::Error(path + ": tensor " + Quote(spec.name) + " has a bad shape " +
                             ShapeString(spec.shape));
      }
    }
    header[spec.name] = {{"dtype", DtypeName(spec.dtype)},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    sizes_bytes.push_back(std::size_t(bytes));
  }
  std::string text;
  try {
    text = header.dump();  // throws on names that are not valid UTF-8
  } catch (const nlohmann::ordered_json::exception& e) {
    return Status::Error(path + ": cannot write header: " + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  SafetensorsWriter writer;
  writer.path_ = path;
  writer.temp_path_ = path + ".partial";
  writer.file_ = std::fopen(writer.temp_path_.c_str(), "wb");
  if (writer.file_ == nullptr) {
    return Status::Error(writer.temp_path_ + ": cannot create: " + std::strerror(errno));
  }
  writer.specs_ = std::move(specs);
  writer.sizes_bytes_ = std::move(sizes_bytes);
  std::byte length[8];
  for (int i = 0; i < 8; ++i) length[i] = std::byte((text.size() >> (8 * i)) & 0xff);
  if (std::fwrite(length, 1, 8, writer.file_) != 8 ||
      std::fwrite(text.data(), 1, text.size(), writer.file_) != text.size()) {
    return Status::Error(writer.temp_path_ + ": write failed: " + std::strerror(errno));
  }
  return writer;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept {
  *this = std::move(other);
}

SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&& other) noexcept {
  if (this != &other) {
    if (file_ != nullptr) {
      std::fclose(file_);
      std::remove(temp_path_.c_str());
    }
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    file_ = std::exchange(other.file_, nullptr);
    specs_ = std::move(other.specs_);
    sizes_bytes_ = std::move(other.sizes_bytes_);
    next_ = other.next_;
  }
  return *this;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(temp_path_.c_str());
  }
}

Status SafetensorsWriter::Append(std::span<const std::byte> data) {
  if (file_ == nullptr) return Status::Error(path_ + ": writer is closed");
  if (next_ >= specs_.size()) return Status::Error(path_ + ": more tensors than declared");
  if (data.size() != sizes_bytes_[next_]) {
    return Status::Error(path_ + ": tensor " + Quote(specs_[next_].name) + " needs " +
                         std::to_string(sizes_bytes_[next_]) + " bytes, got " +
                         std::to_string(data.size()));
  }
  if (!data.empty() && std::fwrite(data.data(), 1, data.size(), file_) != data.size()) {
    return Status::Error(temp_path_ + ": write failed: " + std::strerror(errno));
  }
  ++next_;
  return Status::Ok();
}

Status SafetensorsWriter::Finish() {
  if (file_ == nullptr) return Status::Error(path_ + ": writer is closed");
  if (next_ != specs_.size()) {
    return Status::Error(path_ + ": " + std::to_string(specs_.size() - next_) +
                         " declared tensors were never written");
  }
  const bool closed = std::fclose(std::exchange(file_, nullptr)) == 0;
  if (!closed || std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::remove(temp_path_.c_str());
    return Status::Error(path_ + ": cannot finish writing: " + std::strerror(err));
  }
  return Status::Ok();
}

Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const NamedTensor& tensor : tensors) specs.push_back(tensor.spec);
  Result<SafetensorsWriter> writer = SafetensorsWriter::Create(path, std::move(specs), metadata);
  if (!writer.ok()) return writer.status();
  for (const NamedTensor& tensor : tensors) DUET_RETURN_IF_ERROR(writer->Append(tensor.data));
  return writer->Finish();
}

}  // namespace duet::backend
