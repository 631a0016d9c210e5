// File: core/safetensors.h
//
// A reader for the safetensors format: an 8-byte little-endian header length,
// a JSON header mapping tensor names to {dtype, shape, data_offsets}, then the
// raw little-endian tensor bytes. Only F32, BF16, F16 and BOOL are accepted.
//
// A parsed SafeTensors owns copies of its tensors (64-byte aligned); its
// const methods are safe to call from several threads (Take() is not).
// ReadFile reads each tensor straight into its own storage (no copy of the
// whole file), so a model's load holds its weights once.
//
// Example:
//   ASSIGN_OR_RETURN(SafeTensors st, SafeTensors::ReadFile("model.safetensors"));
//   const Tensor* w = st.Find("out_proj.weight");
#ifndef ATTENTION_CORE_SAFETENSORS_H_
#define ATTENTION_CORE_SAFETENSORS_H_

#include <functional>
#include <map>
#include <optional>
#include <set>
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

  // Reads and parses `path` (errors as Parse's, prefixed with the path).
  // NotFound if the file cannot be opened; DataLoss if it cannot be read;
  // Cancelled once `abandoned` (may be null; asked before each 16 MiB read)
  // says true.
  static absl::StatusOr<SafeTensors> ReadFile(const std::string& path,
                                              const std::function<bool()>& abandoned = nullptr);

  // The length of the JSON header, from the file's first 8 bytes and its
  // size: InvalidArgument if the file is too short or the length too large.
  static absl::StatusOr<uint64_t> HeaderLength(absl::string_view first8, uint64_t file_size);

  // A tensor's header entry: name, dtype, shape and bytes [begin, end) of
  // the data section.
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin;
    uint64_t end;
  };
  // The entries of `path`'s header, checked as Parse checks them against
  // the file's size, without reading the tensors (errors as ReadFile's).
  static absl::StatusOr<std::vector<Entry>> ReadEntries(const std::string& path);

  SafeTensors(SafeTensors&&) = default;
  SafeTensors& operator=(SafeTensors&&) = default;

  // The tensor called `name`, or nullptr (also once taken).
  const Tensor* Find(absl::string_view name) const;
  // Moves the tensor called `name` out (nullopt if there is none): the
  // caller owns it without a copy. Names() still lists it.
  std::optional<Tensor> Take(absl::string_view name);
  // Tensor names in sorted order.
  std::vector<std::string> Names() const;
  // The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafeTensors() = default;
  // Checks a JSON header against a data section of `data_size` bytes (as
  // Parse) and calls `add` for each tensor entry in the file's order;
  // records __metadata__.
  absl::Status ParseHeader(absl::string_view header_json, uint64_t data_size,
                           const std::function<void(const Entry&)>& add);
  // Opens `path` and reads its header: the entries, and where the data
  // section starts. `fd` receives the open file (closed by the caller).
  static absl::StatusOr<std::vector<Entry>> OpenAndReadHeader(
      const std::string& path, const std::function<bool()>& abandoned, int* fd,
      uint64_t* data_start, SafeTensors* st);
  std::map<std::string, Tensor, std::less<>> tensors_;
  std::set<std::string> taken_;  // Names of tensors moved out by Take().
  std::map<std::string, std::string> metadata_;
};

// Serialises `tensors` (name -> tensor) into safetensors bytes. Used by tests
// and tools; the engine itself only reads.
std::string WriteSafeTensors(const std::map<std::string, const Tensor*>& tensors);

}  // namespace attention

#endif  // ATTENTION_CORE_SAFETENSORS_H_
