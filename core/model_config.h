// File: core/model_config.h
//
// The contents of a model directory's `config.json`: the shape of a
// torch.nn.MultiheadAttention layer, its compute dtype (float32, bfloat16,
// or int8 projections with bfloat16 attention), and the serving
// (batching) options the server reads. Plain values: thread-compatible.
//
// Example config.json:
//   {"num_heads": 8, "embed_dim": 256, "compute_dtype": "bfloat16",
//    "max_batch_size": 16}
#ifndef ATTENTION_CORE_MODEL_CONFIG_H_
#define ATTENTION_CORE_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"

namespace attention {

// Batching options a model may set; unset ones take the server's flags.
struct ServingConfig {
  std::optional<int64_t> max_batch_size;      // Requests per executed batch, >= 1.
  std::optional<int64_t> max_batch_tokens;    // Padded query tokens per batch, >= 1.
  std::optional<int64_t> max_queue_delay_us;  // Longest wait of the oldest request, >= 0.
  std::optional<int64_t> max_queue_size;      // Queued requests before refusing, >= 1.
  // Sessions (server-held keys and values):
  std::optional<int64_t> max_sessions;        // Live sessions of this model, >= 0 (0: none).
  std::optional<int64_t> max_session_tokens;  // Tokens one session may hold, >= 1.
  std::optional<int64_t> session_ttl_s;       // Default idle time before expiry, >= 1.
  std::optional<DType> session_cache_dtype;   // float32 or bfloat16 (approximate for float32).
  // The layout of query, key, value and output on the wire, as the layer's
  // torch.nn.MultiheadAttention(batch_first=...) takes them: true (the
  // default, also for a config.json without the key) (N, L, E); false
  // (L, N, E), PyTorch's own default. The engine computes batch-first either
  // way: the server reorders at its boundary. Masks and attention weights
  // have the same shapes in both layouts, as in PyTorch.
  bool batch_first = true;
};

// config.json as written. Every field but num_heads is optional; the model
// loader checks the given ones against the tensors.
struct ModelConfig {
  int64_t num_heads = 0;                  // Required, >= 1, divides embed_dim.
  std::optional<int64_t> embed_dim;       // E.
  std::optional<int64_t> kdim;            // Key features (default E).
  std::optional<int64_t> vdim;            // Value features (default E).
  std::optional<bool> bias;               // in_proj_bias and out_proj.bias present.
  std::optional<bool> add_bias_kv;        // bias_k and bias_v present.
  bool add_zero_attn = false;             // Not visible in the tensors.
  DType compute_dtype = DType::kFloat32;  // float32 or bfloat16.
  // "compute_dtype": "int8": int8 projections (per-channel weights quantized
  // at load, activations per row at run time), attention in bfloat16;
  // compute_dtype is then bfloat16.
  bool int8_weights = false;
  ServingConfig serving;
};

// Parses config.json text. InvalidArgument naming the key for malformed JSON,
// a missing num_heads, a value of the wrong type or range, or an unknown key.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text);

}  // namespace attention

#endif  // ATTENTION_CORE_MODEL_CONFIG_H_
