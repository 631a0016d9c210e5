// File: core/mha_model.h
//
// An MhaModel is the inference state of one torch.nn.MultiheadAttention layer:
// its resolved hyper-parameters and its weights, held as float32 in PyTorch's
// layout (Linear is y = x W^T + b). It is immutable once built, so one model
// may be shared by any number of engines and threads.
//
// A model directory holds `config.json` (see model_config.h) and
// `model.safetensors` with exactly the layer's state_dict names.
#ifndef ATTENTION_CORE_MHA_MODEL_H_
#define ATTENTION_CORE_MHA_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model_config.h"
#include "core/safetensors.h"
#include "core/tensor.h"

namespace attention {

// Resolved hyper-parameters of a layer.
struct MhaSpec {
  int64_t embed_dim = 256;  // E, divisible by num_heads.
  int64_t num_heads = 8;    // H.
  int64_t kdim = 256;       // Key features.
  int64_t vdim = 256;       // Value features.
  bool bias = true;
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  DType compute_dtype = DType::kFloat32;  // float32 or bfloat16.
  // The four projections in int8 (QuantizedLinear: weights per output
  // channel, activations per row); the attention in compute_dtype.
  bool int8_weights = false;

  int64_t head_dim() const { return embed_dim / num_heads; }
  // Keys appended to every sequence: bias_k and the zero key.
  int64_t extra_keys() const { return (add_bias_kv ? 1 : 0) + (add_zero_attn ? 1 : 0); }
  // PyTorch packs q, k and v projections into in_proj_weight when true.
  bool packed_in_proj() const { return kdim == embed_dim && vdim == embed_dim; }
};

// Weights in PyTorch's layout, as float32. Optional ones are empty tensors
// (num_elements() == 0 with an empty shape is never used: check the spec).
struct MhaWeights {
  Tensor q_weight;    // (E, E)
  Tensor k_weight;    // (E, kdim)
  Tensor v_weight;    // (E, vdim)
  Tensor in_bias;     // (3E) when spec.bias
  Tensor out_weight;  // (E, E)
  Tensor out_bias;    // (E) when spec.bias
  Tensor bias_k;      // (E) when spec.add_bias_kv
  Tensor bias_v;      // (E) when spec.add_bias_kv
};

class MhaModel {
 public:
  // Loads `dir`/config.json and `dir`/model.safetensors. NotFound when a file
  // is missing; InvalidArgument, naming the key or tensor, when the config is
  // malformed, a tensor is missing, unexpected, of a wrong dtype or shape, or
  // disagrees with the config.
  static absl::StatusOr<std::shared_ptr<const MhaModel>> LoadFromDirectory(const std::string& dir);
  // As above, asking `abandoned` (may be null) before each 16 MiB of the
  // files is read and before the weights are parsed: once it says true, the
  // load stops with Cancelled. Call it from the loading thread; `abandoned`
  // is called there.
  static absl::StatusOr<std::shared_ptr<const MhaModel>> LoadFromDirectory(
      const std::string& dir, const std::function<bool()>& abandoned);

  // Builds a model from the bytes of config.json and model.safetensors, as
  // LoadFromDirectory does after reading them: InvalidArgument as above
  // (naming the file, key or tensor); ResourceExhausted if memory runs out.
  static absl::StatusOr<std::shared_ptr<const MhaModel>> FromBytes(absl::string_view config_json,
                                                                   absl::string_view safetensors);

  // Builds a model from a parsed config and tensors (same errors as above).
  static absl::StatusOr<std::shared_ptr<const MhaModel>> FromTensors(const ModelConfig& config,
                                                                     const SafeTensors& tensors);

  // The spec of the model in `dir`, from config.json and model.safetensors'
  // header only (the weights are not read): what LoadFromDirectory would
  // resolve, for estimates before loading. Errors as LoadFromDirectory's.
  static absl::StatusOr<MhaSpec> ReadSpec(const std::string& dir);

  // A model with the given spec and weights drawn from a fixed-seed generator
  // (PyTorch-like init scales). InvalidArgument for an impossible spec.
  static absl::StatusOr<std::shared_ptr<const MhaModel>> Random(const MhaSpec& spec, uint64_t seed);

  // The built-in demo model: E=256, 8 heads, bias, float32, seed 2024.
  static std::shared_ptr<const MhaModel> Demo();

  // A copy of this model without its four matrices (spec, serving config,
  // biases and bias_k/bias_v kept; the matrices' tensors empty, data()
  // null): what an engine keeps once it has packed them.
  std::shared_ptr<const MhaModel> WithoutMatrices() const;

  const MhaSpec& spec() const { return spec_; }
  const MhaWeights& weights() const { return weights_; }
  const ServingConfig& serving() const { return serving_; }

 private:
  // FromTensors; `take`: float32 tensors are moved out of `*tensors`.
  static absl::StatusOr<std::shared_ptr<const MhaModel>> Build(const ModelConfig& config,
                                                               SafeTensors* tensors, bool take);

  MhaModel(MhaSpec spec, MhaWeights weights, ServingConfig serving)
      : spec_(spec), weights_(std::move(weights)), serving_(serving) {}

  const MhaSpec spec_;
  const MhaWeights weights_;
  const ServingConfig serving_;
};

// Checks a spec: positive sizes, E divisible by H, compute dtype float32 or
// bfloat16. InvalidArgument naming the field otherwise.
absl::Status ValidateSpec(const MhaSpec& spec);

}  // namespace attention

#endif  // ATTENTION_CORE_MHA_MODEL_H_
