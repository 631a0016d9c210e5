#include "core/mha_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace attention {
namespace {

absl::Status Mismatch(absl::string_view key, int64_t config_value, absl::string_view tensor,
                      int64_t tensor_value) {
  return absl::InvalidArgumentError(absl::StrCat("config.json '", key, "' is ", config_value,
                                                 " but tensor '", tensor, "' implies ",
                                                 tensor_value));
}

// Returns `name` as a float32 tensor of shape `shape`, or an error naming it:
// moved out of `*st` when it is float32 already and `take`, else converted.
absl::StatusOr<Tensor> TakeTensor(SafeTensors* st, bool take, const std::string& name,
                                  const Shape& shape) {
  const Tensor* t = st->Find(name);
  if (t == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model.safetensors: missing tensor '", name,
                                                   "' of shape ", ShapeToString(shape)));
  }
  if (t->dtype() == DType::kBool) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.safetensors: tensor '", name,
                     "' has dtype bool: expected float32, bfloat16 or float16"));
  }
  if (t->shape() != shape) {
    return absl::InvalidArgumentError(absl::StrCat("model.safetensors: tensor '", name,
                                                   "' has shape ", ShapeToString(t->shape()),
                                                   ", expected ", ShapeToString(shape)));
  }
  if (take && t->dtype() == DType::kFloat32) return *st->Take(name);
  return t->ConvertTo(DType::kFloat32);
}

// The whole file, read straight into a string of its size (a stringstream
// would copy a 1 GiB weights file twice more and grow by reallocation), in
// chunks: `abandoned` (when set) is asked before each, so that a load told
// to stop stops within one chunk's read.
absl::StatusOr<std::string> ReadText(const std::string& path,
                                     const std::function<bool()>& abandoned) {
  constexpr std::streamoff kChunk = std::streamoff{16} << 20;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  const std::streamoff size = in.tellg();
  if (size < 0) return absl::DataLossError(absl::StrCat("cannot size '", path, "'"));
  std::string out(static_cast<size_t>(size), '\0');
  in.seekg(0);
  for (std::streamoff done = 0; done < size;) {
    if (abandoned && abandoned()) {
      return absl::CancelledError(absl::StrCat("reading '", path, "' was abandoned"));
    }
    const std::streamoff n = std::min(kChunk, size - done);
    if (!in.read(out.data() + done, n)) {
      return absl::DataLossError(absl::StrCat("cannot read '", path, "' (", size, " bytes)"));
    }
    done += n;
  }
  return out;
}

// Splits rows [row0, row0 + rows) of a (R, C) float32 tensor into a new one.
Tensor Rows(const Tensor& t, int64_t row0, int64_t rows) {
  const int64_t cols = t.rank() == 2 ? t.dim(1) : 1;
  Shape shape = t.rank() == 2 ? Shape{rows, cols} : Shape{rows};
  return Tensor::FromBytes(DType::kFloat32, shape, t.as<float>() + row0 * cols);
}

// Deterministic uniform numbers in [-bound, bound) from splitmix64.
class Uniform {
 public:
  explicit Uniform(uint64_t seed) : state_(seed) {}
  float Next(float bound) {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) / static_cast<double>(1ull << 53);
    return static_cast<float>((2.0 * u - 1.0) * bound);
  }
  Tensor Fill(Shape shape, float bound) {
    Tensor t(DType::kFloat32, std::move(shape));
    float* p = t.mutable_as<float>();
    for (int64_t i = 0; i < t.num_elements(); ++i) p[i] = Next(bound);
    return t;
  }

 private:
  uint64_t state_;
};

absl::Status ValidateSpecImpl(const MhaSpec& s);

}  // namespace

absl::Status ValidateSpec(const MhaSpec& s) { return ValidateSpecImpl(s); }

namespace {

absl::Status ValidateSpecImpl(const MhaSpec& s) {
  if (s.embed_dim <= 0 || s.num_heads <= 0 || s.kdim <= 0 || s.vdim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: embed_dim, num_heads, kdim and vdim must be positive, got ",
                     s.embed_dim, ", ", s.num_heads, ", ", s.kdim, ", ", s.vdim));
  }
  if (s.embed_dim % s.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model: embed_dim ", s.embed_dim,
                                                   " is not divisible by num_heads ", s.num_heads));
  }
  if (s.compute_dtype != DType::kFloat32 && s.compute_dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: compute_dtype must be float32 or bfloat16, got ", DTypeName(s.compute_dtype)));
  }
  return absl::OkStatus();
}

absl::StatusOr<MhaSpec> SpecFromShapes(
    const ModelConfig& config, const std::function<const Shape*(const std::string&)>& find) {
  MhaSpec spec;
  spec.num_heads = config.num_heads;
  spec.add_zero_attn = config.add_zero_attn;
  spec.compute_dtype = config.compute_dtype;
  spec.int8_weights = config.int8_weights;

  // E from out_proj.weight, checked against the config.
  const Shape* out_w = find("out_proj.weight");
  if (out_w == nullptr || out_w->size() != 2) {
    return absl::InvalidArgumentError(
        "model.safetensors: missing 2-D tensor 'out_proj.weight' of shape [E, E]");
  }
  spec.embed_dim = (*out_w)[0];
  if (config.embed_dim && *config.embed_dim != spec.embed_dim) {
    return Mismatch("embed_dim", *config.embed_dim, "out_proj.weight", spec.embed_dim);
  }
  const int64_t e = spec.embed_dim;

  // Packed or separate input projections decide kdim and vdim.
  const bool packed = find("in_proj_weight") != nullptr;
  spec.kdim = e;
  spec.vdim = e;
  if (!packed) {
    const Shape* kw = find("k_proj_weight");
    const Shape* vw = find("v_proj_weight");
    if (kw == nullptr || vw == nullptr || kw->size() != 2 || vw->size() != 2) {
      return absl::InvalidArgumentError(
          "model.safetensors: missing 'in_proj_weight' [3E, E] or the separate "
          "'q_proj_weight', 'k_proj_weight' [E, kdim], 'v_proj_weight' [E, vdim]");
    }
    spec.kdim = (*kw)[1];
    spec.vdim = (*vw)[1];
    if (spec.packed_in_proj()) {
      return absl::InvalidArgumentError(
          "model.safetensors: kdim == vdim == embed_dim, so PyTorch stores "
          "'in_proj_weight'; found separate q/k/v_proj_weight instead");
    }
  }
  if (config.kdim && *config.kdim != spec.kdim) {
    return Mismatch("kdim", *config.kdim, packed ? "in_proj_weight" : "k_proj_weight", spec.kdim);
  }
  if (config.vdim && *config.vdim != spec.vdim) {
    return Mismatch("vdim", *config.vdim, packed ? "in_proj_weight" : "v_proj_weight", spec.vdim);
  }
  spec.bias = find("in_proj_bias") != nullptr || find("out_proj.bias") != nullptr;
  if (config.bias && *config.bias != spec.bias) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json 'bias' is ", *config.bias ? "true" : "false", " but model.safetensors ",
        spec.bias ? "has" : "has no", " 'in_proj_bias'/'out_proj.bias'"));
  }
  spec.add_bias_kv = find("bias_k") != nullptr || find("bias_v") != nullptr;
  if (config.add_bias_kv && *config.add_bias_kv != spec.add_bias_kv) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json 'add_bias_kv' is ", *config.add_bias_kv ? "true" : "false",
        " but model.safetensors ", spec.add_bias_kv ? "has" : "has no", " 'bias_k'/'bias_v'"));
  }
  RETURN_IF_ERROR(ValidateSpec(spec));
  return spec;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const MhaModel>> MhaModel::FromTensors(const ModelConfig& config,
                                                                      const SafeTensors& st) {
  // Nothing is taken: the const_cast never writes.
  return Build(config, const_cast<SafeTensors*>(&st), /*take=*/false);
}

absl::StatusOr<std::shared_ptr<const MhaModel>> MhaModel::Build(const ModelConfig& config,
                                                                SafeTensors* st, bool take) {
  ASSIGN_OR_RETURN(const MhaSpec spec, SpecFromShapes(config, [&](const std::string& name) {
                     const Tensor* t = st->Find(name);
                     return t == nullptr ? nullptr : &t->shape();
                   }));
  const int64_t e = spec.embed_dim;
  const bool packed = spec.packed_in_proj();

  std::set<std::string> expected = {"out_proj.weight"};
  MhaWeights w;
  if (packed) {
    // Split into q, k and v, the packed tensor freed as soon as it is.
    ASSIGN_OR_RETURN(Tensor in_w, TakeTensor(st, take, "in_proj_weight", {3 * e, e}));
    w.q_weight = Rows(in_w, 0, e);
    w.k_weight = Rows(in_w, e, e);
    w.v_weight = Rows(in_w, 2 * e, e);
    in_w = Tensor();
    expected.insert("in_proj_weight");
  } else {
    ASSIGN_OR_RETURN(w.q_weight, TakeTensor(st, take, "q_proj_weight", {e, e}));
    ASSIGN_OR_RETURN(w.k_weight, TakeTensor(st, take, "k_proj_weight", {e, spec.kdim}));
    ASSIGN_OR_RETURN(w.v_weight, TakeTensor(st, take, "v_proj_weight", {e, spec.vdim}));
    expected.insert({"q_proj_weight", "k_proj_weight", "v_proj_weight"});
  }
  ASSIGN_OR_RETURN(w.out_weight, TakeTensor(st, take, "out_proj.weight", {e, e}));
  if (spec.bias) {
    ASSIGN_OR_RETURN(w.in_bias, TakeTensor(st, take, "in_proj_bias", {3 * e}));
    ASSIGN_OR_RETURN(w.out_bias, TakeTensor(st, take, "out_proj.bias", {e}));
    expected.insert({"in_proj_bias", "out_proj.bias"});
  }
  if (spec.add_bias_kv) {
    ASSIGN_OR_RETURN(w.bias_k, TakeTensor(st, take, "bias_k", {1, 1, e}));
    ASSIGN_OR_RETURN(w.bias_v, TakeTensor(st, take, "bias_v", {1, 1, e}));
    RETURN_IF_ERROR(w.bias_k.Reshape({e}));
    RETURN_IF_ERROR(w.bias_v.Reshape({e}));
    expected.insert({"bias_k", "bias_v"});
  }
  for (const std::string& name : st->Names()) {
    if (expected.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.safetensors: unexpected tensor '", name,
                       "'; this layer has: ", absl::StrJoin(expected, ", ")));
    }
  }
  return std::shared_ptr<const MhaModel>(new MhaModel(spec, std::move(w), config.serving));
}

absl::StatusOr<std::shared_ptr<const MhaModel>> MhaModel::FromBytes(absl::string_view config_json,
                                                                    absl::string_view safetensors) {
  return ResourceExhaustedOnBadAlloc(
      "model load", [&]() -> absl::StatusOr<std::shared_ptr<const MhaModel>> {
        ASSIGN_OR_RETURN(const ModelConfig config, ParseModelConfig(config_json));
        ASSIGN_OR_RETURN(SafeTensors st, SafeTensors::Parse(safetensors));
        return Build(config, &st, /*take=*/true);
      });
}

absl::StatusOr<std::shared_ptr<const MhaModel>> MhaModel::LoadFromDirectory(
    const std::string& dir) {
  return LoadFromDirectory(dir, nullptr);
}

absl::StatusOr<std::shared_ptr<const MhaModel>> MhaModel::LoadFromDirectory(
    const std::string& dir, const std::function<bool()>& abandoned) {
  return ResourceExhaustedOnBadAlloc(
      "model load", [&]() -> absl::StatusOr<std::shared_ptr<const MhaModel>> {
        ASSIGN_OR_RETURN(const std::string config_json, ReadText(dir + "/config.json", abandoned));
        auto with_dir = [&](const absl::Status& status) {
          return absl::Status(status.code(), absl::StrCat(dir, ": ", status.message()));
        };
        auto config = ParseModelConfig(config_json);
        if (!config.ok()) return with_dir(config.status());
        // Each tensor read once, into its own storage; float32 ones then
        // moved into the model.
        absl::StatusOr<SafeTensors> st =
            SafeTensors::ReadFile(dir + "/model.safetensors", abandoned);
        if (!st.ok()) {
          if (st.status().code() == absl::StatusCode::kCancelled ||
              st.status().code() == absl::StatusCode::kNotFound) {
            return st.status();
          }
          return with_dir(st.status());
        }
        if (abandoned && abandoned()) {
          return absl::CancelledError(absl::StrCat(dir, ": the load was abandoned"));
        }
        auto model = Build(*config, &*st, /*take=*/true);
        if (!model.ok()) return with_dir(model.status());
        return model;
      });
}

absl::StatusOr<MhaSpec> MhaModel::ReadSpec(const std::string& dir) {
  return ResourceExhaustedOnBadAlloc("model spec", [&]() -> absl::StatusOr<MhaSpec> {
    ASSIGN_OR_RETURN(const std::string config_json, ReadText(dir + "/config.json", nullptr));
    ASSIGN_OR_RETURN(const ModelConfig config, ParseModelConfig(config_json));
    ASSIGN_OR_RETURN(const std::vector<SafeTensors::Entry> entries,
                     SafeTensors::ReadEntries(dir + "/model.safetensors"));
    return SpecFromShapes(config, [&](const std::string& name) -> const Shape* {
      for (const SafeTensors::Entry& e : entries) {
        if (e.name == name) return &e.shape;
      }
      return nullptr;
    });
  });
}

absl::StatusOr<std::shared_ptr<const MhaModel>> MhaModel::Random(const MhaSpec& spec,
                                                                 uint64_t seed) {
  RETURN_IF_ERROR(ValidateSpec(spec));
  const int64_t e = spec.embed_dim;
  Uniform rng(seed);
  // xavier_uniform over the packed (3E, E) matrix, as PyTorch initialises it.
  const float in_bound = std::sqrt(6.0f / static_cast<float>(e + 3 * e));
  const float out_bound = 1.0f / std::sqrt(static_cast<float>(e));
  MhaWeights w;
  w.q_weight = rng.Fill({e, e}, in_bound);
  w.k_weight = rng.Fill({e, spec.kdim}, in_bound);
  w.v_weight = rng.Fill({e, spec.vdim}, in_bound);
  w.out_weight = rng.Fill({e, e}, out_bound);
  if (spec.bias) {
    w.in_bias = rng.Fill({3 * e}, 0.1f);
    w.out_bias = rng.Fill({e}, 0.1f);
  }
  if (spec.add_bias_kv) {
    w.bias_k = rng.Fill({e}, 0.5f);
    w.bias_v = rng.Fill({e}, 0.5f);
  }
  return std::shared_ptr<const MhaModel>(new MhaModel(spec, std::move(w), ServingConfig{}));
}

std::shared_ptr<const MhaModel> MhaModel::WithoutMatrices() const {
  MhaWeights w;
  if (spec_.bias) {
    w.in_bias = weights_.in_bias.Clone();
    w.out_bias = weights_.out_bias.Clone();
  }
  if (spec_.add_bias_kv) {
    w.bias_k = weights_.bias_k.Clone();
    w.bias_v = weights_.bias_v.Clone();
  }
  return std::shared_ptr<const MhaModel>(new MhaModel(spec_, std::move(w), serving_));
}

std::shared_ptr<const MhaModel> MhaModel::Demo() {
  MhaSpec spec;  // The defaults are the demo's shape.
  return *Random(spec, /*seed=*/2024);
}

}  // namespace attention
