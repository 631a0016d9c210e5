// File: client/cli/npy.h
//
// NumPy .npy files (format 1.0/2.0/3.0, C order) to and from core tensors.
// Supported dtypes: '<f4' float32, '<f2' float16, '|b1' bool, '<f8'
// float64 (read only, converted to float32), and bfloat16 stored as raw
// 2-byte '<u2' words (NumPy has no bfloat16). Pure functions.
#ifndef ATTENTION_CLIENT_CLI_NPY_H_
#define ATTENTION_CLIENT_CLI_NPY_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace attention::client {

// Reads `path`. NotFound if it cannot be opened; InvalidArgument naming the
// file for a bad magic, header, dtype, Fortran order or truncated data.
absl::StatusOr<Tensor> ReadNpy(const std::string& path);

// Parses .npy bytes (`name` is used in messages).
absl::StatusOr<Tensor> ParseNpy(const std::string& bytes, const std::string& name);

// Writes `t` to `path` (format 1.0). Internal if the file cannot be written.
absl::Status WriteNpy(const std::string& path, const Tensor& t);

// The .npy bytes of `t`.
std::string SerializeNpy(const Tensor& t);

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_NPY_H_
