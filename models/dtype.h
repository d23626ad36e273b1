// The element types Duet stores weights and KV caches in (bf16, fp16, fp32), with their sizes
// and their two spellings: safetensors' ("BF16") and Hugging Face torch_dtype's ("bfloat16").
// Shared by the model description (models/), the simulator's KV sizing and the backend's
// checkpoint reader, so there is one dtype concept. Pure C++.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace duet::models {

enum class Dtype { kBF16, kF16, kF32 };

std::size_t DtypeBytes(Dtype dtype);  // 2, 2, 4
const char* DtypeName(Dtype dtype);   // "BF16", "F16", "F32" (the safetensors spelling)
std::optional<Dtype> DtypeFromName(std::string_view name);
const char* TorchDtypeName(Dtype dtype);  // "bfloat16", "float16", "float32"
std::optional<Dtype> DtypeFromTorchName(std::string_view name);

}  // namespace duet::models
