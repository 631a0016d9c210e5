#include "server/sessions/append_size.h"

namespace attention::server {

int64_t AppendResponseBytes(const MhaSpec& spec, int64_t tokens, int64_t columns, DType out_dtype,
                            bool need_weights, bool average_weights, int64_t id_bytes) {
  const int64_t out_size = static_cast<int64_t>(DTypeSize(out_dtype));
  int64_t bytes = tokens * spec.embed_dim * out_size + kResponseFramingBytes + id_bytes;
  if (need_weights) bytes += (average_weights ? 1 : spec.num_heads) * tokens * columns * out_size;
  return bytes;
}

int64_t AppendWorkingBytes(const SessionEngine& engine, int64_t tokens, int64_t columns,
                           DType out_dtype, bool need_weights, bool average_weights) {
  const MhaSpec& spec = engine.spec();
  const int64_t f32 = static_cast<int64_t>(sizeof(float));
  int64_t bytes = engine.StepWorkingBytes(tokens, columns, need_weights, average_weights);
  if (out_dtype != DType::kFloat32) bytes += tokens * spec.embed_dim * f32;
  if (need_weights && out_dtype != DType::kFloat32) {
    bytes += (average_weights ? 1 : spec.num_heads) * tokens * columns * f32;
  }
  return bytes;
}

}  // namespace attention::server
