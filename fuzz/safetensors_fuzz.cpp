// Fuzz target for the safetensors header parser (the only code that reads untrusted checkpoint
// bytes): the input is treated as a whole file image through SafetensorsFile::FromBuffer, the
// same path Open takes after mapping. Every tensor of an accepted file must lie inside the
// image with a byte size matching its shape, and small tensors are widened to fp32.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/model/safetensors.h"
#include "common/status.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  duet::Result<duet::backend::SafetensorsFile> file =
      duet::backend::SafetensorsFile::FromBuffer(bytes, "fuzz.safetensors");
  if (!file.ok()) {
    DUET_CHECK(file.error().rfind("fuzz.safetensors", 0) == 0);  // errors name the file
    return 0;
  }
  std::size_t total_bytes = 0;
  for (const std::string& name : file->TensorNames()) {
    const duet::backend::TensorView* view = file->Find(name);
    DUET_CHECK(view != nullptr);
    DUET_CHECK(view->data >= bytes.data() && view->bytes <= size &&
               view->data + view->bytes <= bytes.data() + size);
    DUET_CHECK(std::uint64_t(view->NumElements()) * duet::backend::DtypeBytes(view->dtype) ==
               view->bytes);
    total_bytes += view->bytes;
    if (view->NumElements() <= (1 << 16)) {
      double sum = 0;
      for (float v : duet::backend::ToFloat32(*view)) sum += std::isfinite(v) ? v : 0;
      (void)sum;
    }
  }
  // The tensors tile the data section, which ends the file.
  DUET_CHECK(total_bytes <= size);
  return 0;
}
