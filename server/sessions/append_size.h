// File: server/sessions/append_size.h
//
// What an append costs, at most: its response's size and the memory
// computing it takes. The session path sizes an append with these when it
// is read; the session batch runner again, exactly, when it runs.
// Stateless functions.
#ifndef ATTENTION_SERVER_SESSIONS_APPEND_SIZE_H_
#define ATTENTION_SERVER_SESSIONS_APPEND_SIZE_H_

#include <cstdint>

#include "core/mha_model.h"
#include "core/session_engine.h"
#include "core/tensor.h"

namespace attention::server {

// Field tags and lengths, shapes, timings of a response: well under this.
inline constexpr int64_t kResponseFramingBytes = 1024;

// The size of an append's response, at most: output (T, E) and, when asked,
// weights over `columns` keys, in `out_dtype`, with framing and `id_bytes`.
int64_t AppendResponseBytes(const MhaSpec& spec, int64_t tokens, int64_t columns, DType out_dtype,
                            bool need_weights, bool average_weights, int64_t id_bytes);

// An upper bound on what computing an append allocates besides its
// response: the engine's working memory and this runner's float32 buffers.
int64_t AppendWorkingBytes(const SessionEngine& engine, int64_t tokens, int64_t columns,
                           DType out_dtype, bool need_weights, bool average_weights);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SESSIONS_APPEND_SIZE_H_
