// Names and sizes of the element types (see dtype.h): the safetensors spelling for checkpoint
// headers, the torch_dtype spelling for config.json and cluster files.
#include "models/dtype.h"

namespace duet::models {

std::size_t DtypeBytes(Dtype dtype) { return dtype == Dtype::kF32 ? 4 : 2; }

const char* DtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBF16:
      return "BF16";
    case Dtype::kF16:
      return "F16";
    case Dtype::kF32:
      return "F32";
  }
  return "?";
}

std::optional<Dtype> DtypeFromName(std::string_view name) {
  if (name == "BF16") return Dtype::kBF16;
  if (name == "F16") return Dtype::kF16;
  if (name == "F32") return Dtype::kF32;
  return std::nullopt;
}

const char* TorchDtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBF16:
      return "bfloat16";
    case Dtype::kF16:
      return "float16";
    case Dtype::kF32:
      return "float32";
  }
  return "?";
}

std::optional<Dtype> DtypeFromTorchName(std::string_view name) {
  if (name == "bfloat16") return Dtype::kBF16;
  if (name == "float16") return Dtype::kF16;
  if (name == "float32") return Dtype::kF32;
  return std::nullopt;
}

}  // namespace duet::models
