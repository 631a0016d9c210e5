// File: core/mha_engine.h
//
// MhaEngine runs the inference of one torch.nn.MultiheadAttention layer on
// CPU through oneDNN, batch-first, with PyTorch 2.x's mask semantics:
//
//   out = out_proj(softmax((x_q W_q^T + b_q) (x_k W_k^T + b_k)^T / sqrt(d)
//                          + mask) (x_v W_v^T + b_v))
//
// where `mask` is key_padding_mask and attn_mask made additive (bool true ->
// -inf) and summed, plus the causal mask when is_causal. A query row whose
// keys are all masked gets zero weights and a zero context, so its output row
// is out_proj.bias (PyTorch >= 2.5 SDPA behaviour); NaN inputs give NaN where
// PyTorch does (attention_kernel.h).
//
// Thread safety: Forward() and ForwardBatch() may be called from
// any number of threads at once. Weights are prepared once at Create(); oneDNN
// primitives are created once per shape and kept in a bounded cache; each call
// runs them with its own scratchpad. No exception escapes.
//
// Example:
//   ASSIGN_OR_RETURN(auto engine, MhaEngine::Create(MhaModel::Demo()));
//   MhaInputs in;
//   in.query = TensorView{DType::kFloat32, {1, 32, 256}, data};
//   ASSIGN_OR_RETURN(MhaOutputs out, engine->Forward(in));
#ifndef ATTENTION_CORE_MHA_ENGINE_H_
#define ATTENTION_CORE_MHA_ENGINE_H_

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention_kernel.h"
#include "core/attention_mask.h"
#include "core/mha_model.h"
#include "core/primitive_cache.h"
#include "core/quantized_linear.h"
#include "core/tensor.h"

namespace attention {

// One forward call, in torch.nn.MultiheadAttention's terms (batch_first).
struct MhaInputs {
  TensorView query;                 // (N, L, E) or unbatched (L, E).
  std::optional<TensorView> key;    // (N, S, kdim); absent: the query.
  std::optional<TensorView> value;  // (N, S, vdim); absent: the key.
  // (N, S) or (S): bool (true = ignore the key) or float (added to scores).
  std::optional<TensorView> key_padding_mask;
  // (L, S) or (N*H, L, S) indexed n*H + h ((H, L, S) unbatched): bool (true =
  // not allowed) or float (added).
  std::optional<TensorView> attn_mask;
  bool is_causal = false;             // Adds the top-left aligned causal mask.
  bool need_weights = false;          // Return attention probabilities.
  bool average_attn_weights = true;   // (N, L, S') if true, else (N, H, L, S').
  std::optional<DType> output_dtype;  // Default: the query's dtype.
};

struct MhaOutputs {
  Tensor output;                       // The query's shape with E features.
  std::optional<Tensor> attn_weights;  // When need_weights; S' includes appended keys.
};

// The shape of a validated call: what the batcher needs to combine calls.
struct MhaCall {
  bool batched = true;          // False for unbatched (L, E) inputs.
  int64_t batch = 1;            // N (1 when unbatched).
  int64_t queries = 0;          // L.
  int64_t keys = 0;             // S, before appended keys.
  bool self_attention = true;   // No key given: keys and values are the query.
  std::vector<ItemMask> items;  // One per batch item, borrowing the masks.
};

struct EngineOptions {
  size_t primitive_cache_capacity = 512;  // oneDNN primitives kept per engine.
  KernelOptions kernel;
  // Run the projections in int8 even when the model's spec does not ask for
  // it (spec().int8_weights, config.json "compute_dtype": "int8"): a float32
  // model quantized at load, attention in bfloat16 (attention-core-bench
  // --dtype=int8).
  bool int8_weights = false;
  // Keep the model's float32 matrices (model().weights()) after they are
  // packed. False: the engine holds a copy of the model without them
  // (spec, serving, biases), so that once the caller drops its own pointer
  // the prepared weights are the only copy (the server's repository does).
  // Tests and benches that read model().weights() keep the default.
  bool keep_model_weights = true;
};

class MhaEngine {
 public:
  // Prepares `model`'s weights for compute, once, in the layout oneDNN's
  // matmul reads (weight_layout.h: transposed, 1/sqrt(head_dim) folded into
  // the query projection, converted to the compute dtype, or quantized to
  // int8); q, k and v share one buffer with the fused projection when the
  // layout allows. InvalidArgument if the model's spec is invalid (or its
  // matrices were dropped); Internal if oneDNN cannot lay out the weights.
  static absl::StatusOr<std::unique_ptr<MhaEngine>> Create(std::shared_ptr<const MhaModel> model,
                                                           EngineOptions options = {});

  MhaEngine(const MhaEngine&) = delete;
  MhaEngine& operator=(const MhaEngine&) = delete;

  // Checks `inputs` against the model: ranks, shapes, dtypes and masks.
  // OK: the call's shape (borrowing the mask views). InvalidArgument naming
  // the tensor with the expected and the actual shape or dtype otherwise.
  absl::StatusOr<MhaCall> Validate(const MhaInputs& inputs) const;

  // Runs the layer. OK: the outputs. InvalidArgument naming the tensor, the
  // expected and the actual shape or dtype for bad inputs; Internal if oneDNN
  // fails.
  absl::StatusOr<MhaOutputs> Forward(const MhaInputs& inputs) const;

  // Runs the layer on a batch of N items of (padded) length L and S, with
  // masks of each item's own: `query` (N, L, E), `key` (N, S, kdim) and
  // `value` (N, S, vdim) (absent: self-attention on `query`), `items` one per
  // batch item. Keys beyond an item's valid_keys are masked out; query rows
  // beyond its valid_queries are computed but meaningless. `weights`, when
  // given, receives (N, H, L, S') float32 probabilities; the appended keys are
  // the last extra_keys() columns. Output (N, L, E) float32 into `output`.
  // Shapes are checked again here (InvalidArgument): a caller's mistake
  // cannot make a projection read or write past a buffer.
  absl::Status ForwardBatch(const TensorView& query, const std::optional<TensorView>& key,
                            const std::optional<TensorView>& value,
                            const std::vector<ItemMask>& items, float* output,
                            float* weights) const;

  // The layer's projections, for callers that keep keys and values
  // themselves (sessions): y (rows, E) float32 = x (rows, in) W^T + b for
  // dense x of any float dtype. kQuery has 1/sqrt(head_dim) folded in.
  // kQueryKeyValue (only when has_fused_qkv()) is all three in one GEMM:
  // y (rows, 3E), each row q, k, v (FailedPrecondition otherwise).
  // InvalidArgument unless x is (rows, in) with `in` the part's input width
  // (E, kdim or vdim).
  enum class Part { kQuery, kKey, kValue, kOut, kQueryKeyValue };
  absl::Status Project(Part part, const TensorView& x, float* y) const;

  // An upper bound on the bytes ForwardBatch allocates (workspaces: the
  // inputs in the compute dtype, the projections, the attention kernel's
  // buffers, oneDNN's scratchpads) for `items` items of `queries` query and
  // `keys` key rows (before the appended keys). The caller's output and
  // weights buffers are not included. Tests check it with MemoryMeter.
  int64_t WorkingBytes(int64_t items, int64_t queries, int64_t keys, bool self_attention,
                       bool need_weights) const;
  // The same for Project() of `rows` rows of `part`.
  int64_t ProjectWorkingBytes(Part part, int64_t rows) const;
  // oneDNN's scratchpad for one primitive run, at most (it comes from a
  // workspace sized by the primitive; this bounds it for the estimates).
  static constexpr int64_t kScratchpadAllowance = int64_t{4} << 20;

  // True when Project(kQueryKeyValue) is available: kdim == vdim == E and
  // q, k and v are thirds of one prepared buffer (E % 64 == 0 with oneDNN's
  // blocked layouts), or the projections are int8.
  bool has_fused_qkv() const {
    return qkv_proj_.packed != nullptr || qkv_proj_.quantized != nullptr;
  }

  // The bytes this engine keeps resident for its weights: the prepared
  // buffers, biases and the model it holds (its matrices too when
  // keep_model_weights). Within a page or so per buffer of the resident
  // set's growth by Create (tests/memory/model_resident_test.cc).
  int64_t resident_bytes() const;
  // resident_bytes() of an engine for a model of `spec` made with `options`
  // (keep_model_weights aside: counted as false), without building it: the
  // same layout queries, no weights. Internal if oneDNN fails.
  static absl::StatusOr<int64_t> EstimateResidentBytes(const MhaSpec& spec,
                                                       const EngineOptions& options);

  // The model this engine holds: the one given to Create, or its copy
  // without matrices (keep_model_weights false).
  const MhaModel& model() const { return *model_; }
  std::shared_ptr<const MhaModel> shared_model() const { return model_; }
  const PrimitiveCache& cache() const { return cache_; }

 private:
  // A projection's prepared weights: W^T (in, out) in the compute dtype,
  // laid out as packed_md (oneDNN's preferred layout), and a float32 bias
  // (or null); or, for int8, the QuantizedLinear that runs it.
  struct Projection {
    const float* bias = nullptr;
    int64_t in = 0;
    int64_t out = 0;
    const void* packed = nullptr;
    dnnl::memory::desc packed_md;
    const QuantizedLinear* quantized = nullptr;
  };
  static Projection MakeProjection(const float* bias, int64_t in, int64_t out) {
    Projection p;
    p.bias = bias;
    p.in = in;
    p.out = out;
    return p;
  }
  // The float layouts of a layer's projections (weight_layout.h); `fused`:
  // q, k and v are the thirds of `qkv`. Throws dnnl::error.
  struct Layouts {
    dnnl::memory::desc q, k, v, out, qkv;
    bool fused = false;
  };
  static Layouts PlanLayouts(const MhaSpec& spec, DType compute);
  static DType ComputeDType(const MhaSpec& spec, const EngineOptions& options);

  MhaEngine(std::shared_ptr<const MhaModel> model, EngineOptions options);

  // y[b] = x[b] W^T + bias for `batches` blocks of `rows` rows; x dense in
  // `x_dtype` (the compute dtype, or for int8 projections float32 or
  // bfloat16), y with row stride `out` features and block stride
  // `dst_block_stride` elements (0: dense), of `dst_dtype`.
  absl::Status Linear(const Projection& proj, const void* x, DType x_dtype, int64_t batches,
                      int64_t rows, void* y, DType dst_dtype, int64_t dst_block_stride) const;
  // The dtype the projections take inputs given in `given`: the compute
  // dtype, or for int8 projections float32 or bfloat16 as given (float16 as
  // float32), quantized from there.
  DType InputDType(DType given) const;
  // Prepares the projections (Pack or Quantize), then drops the model's
  // matrices unless options_.keep_model_weights. Internal on failure.
  absl::Status Prepare();
  // int8: quantizes every projection (QuantizedLinear). Internal on failure.
  absl::Status Quantize();
  // float32 / bfloat16: reorders every projection's weights once into its
  // layout (PlanLayouts). Throws dnnl::error.
  void Pack();
  // InvalidArgument unless ForwardBatch's tensors fit the model and each
  // other (the widths every projection reads).
  absl::Status CheckBatchShapes(const TensorView& query, const std::optional<TensorView>& key,
                                const std::optional<TensorView>& value,
                                const std::vector<ItemMask>& items) const;
  absl::Status RunForward(const TensorView& query, const std::optional<TensorView>& key,
                          const std::optional<TensorView>& value, const MaskPlan& plan,
                          float* output, float* weights, bool average_weights) const;

  std::shared_ptr<const MhaModel> model_;  // Set only during Create.
  const EngineOptions options_;
  const bool int8_;  // Projections in int8 (spec or options).
  const DType compute_;
  Tensor qkv_bias_;  // (3E) float32 when bias; q's part scaled like W_q.
  Tensor out_bias_;  // (E) float32 when bias.
  Tensor bias_kv_;   // (2, E) in the compute dtype when add_bias_kv.
  Projection q_proj_, k_proj_, v_proj_, out_proj_;
  Projection qkv_proj_;                 // Fused self-attention projection (has_fused_qkv()).
  std::vector<Tensor> packed_weights_;  // Storage of the packed weights.
  std::vector<std::unique_ptr<QuantizedLinear>> quantized_;  // int8 projections.
  mutable PrimitiveCache cache_;
};

}  // namespace attention

#endif  // ATTENTION_CORE_MHA_ENGINE_H_
