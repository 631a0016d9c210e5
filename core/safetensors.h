// File: core/safetensors.h
//
// A reader for the safetensors format: an 8-byte little-endian header length,
// a JSON header mapping tensor names to {dtype, shape, data_offsets}, then the
// raw little-endian tensor bytes. Only F32, BF16, F16 and BOOL are accepted.
//
// A parsed SafeTensors owns copies of its tensors (64-byte aligned) and is
// immutable, hence safe to read from several threads.
//
// Example:
//   ASSIGN_OR_RETURN(SafeTensors st, SafeTensors::ReadFile("model.safetensors"));
//   const Tensor* w = st.Find("out_proj.weight");
#ifndef ATTENTION_CORE_SAFETENSORS_H_
#define ATTENTION_CORE_SAFETENSORS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace attention {

class SafeTensors {
 public:
  // Parses a whole file's bytes. InvalidArgument (naming the tensor where
  // there is one) for: a file shorter than its header, a header that is not a
  // JSON object of well-formed entries, an unsupported dtype, a shape whose
  // byte size differs from its offsets, offsets out of range, overlapping or
  // leaving unreferenced bytes in the data section.
  static absl::StatusOr<SafeTensors> Parse(absl::string_view bytes);

  // Reads and parses `path`. NotFound if the file cannot be opened.
  static absl::StatusOr<SafeTensors> ReadFile(const std::string& path);

  SafeTensors(SafeTensors&&) = default;
  SafeTensors& operator=(SafeTensors&&) = default;

  // The tensor called `name`, or nullptr.
  const Tensor* Find(absl::string_view name) const;
  // Tensor names in sorted order.
  std::vector<std::string> Names() const;
  // The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafeTensors() = default;
  std::map<std::string, Tensor, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Serialises `tensors` (name -> tensor) into safetensors bytes. Used by tests
// and tools; the engine itself only reads.
std::string WriteSafeTensors(const std::map<std::string, const Tensor*>& tensors);

}  // namespace attention

#endif  // ATTENTION_CORE_SAFETENSORS_H_
