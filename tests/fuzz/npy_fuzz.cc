// The .npy reader: whatever it accepts must survive a write and a re-read.
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cli/npy.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "tests/fuzz/fuzz_entries.h"

namespace attention::fuzz {

absl::Status FuzzOneNpy(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  ASSIGN_OR_RETURN(const Tensor t, client::ParseNpy(bytes, "fuzz.npy"));
  auto back = client::ParseNpy(client::SerializeNpy(t), "rewritten.npy");
  if (!back.ok()) {
    return absl::InternalError(absl::StrCat("fuzz invariant: an accepted .npy does not read back: ",
                                            back.status().message()));
  }
  if (back->dtype() != t.dtype() || back->shape() != t.shape() ||
      back->num_bytes() != t.num_bytes() ||
      (t.num_bytes() > 0 && std::memcmp(back->data(), t.data(), t.num_bytes()) != 0)) {
    return absl::InternalError(absl::StrCat("fuzz invariant: .npy read back as ",
                                            DTypeName(back->dtype()), " ",
                                            ShapeToString(back->shape()), ", expected ",
                                            DTypeName(t.dtype()), " ", ShapeToString(t.shape())));
  }
  return absl::OkStatus();
}

}  // namespace attention::fuzz
