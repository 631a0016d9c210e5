// A model directory from bytes: config.json and model.safetensors loaded as
// the server loads them, and a small model that loads run once.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/mha_engine.h"
#include "core/mha_model.h"
#include "core/status_macros.h"
#include "tests/fuzz/fuzz_entries.h"

namespace attention::fuzz {
namespace {

// Models up to this many weights are also run (a few microseconds each).
constexpr int64_t kMaxRunWeights = 64 * 64 * 4;

// One forward pass of 3 queries over 2 keys with weights, whose output must
// have the documented shapes.
absl::Status RunOnce(std::shared_ptr<const MhaModel> model) {
  const MhaSpec& s = model->spec();
  auto engine = MhaEngine::Create(model);
  if (!engine.ok()) {
    return absl::InternalError(absl::StrCat("fuzz invariant: a model that loaded has no engine: ",
                                            engine.status().message()));
  }
  Tensor query(DType::kFloat32, {1, 3, s.embed_dim});
  Tensor key(DType::kFloat32, {1, 2, s.kdim});
  Tensor value(DType::kFloat32, {1, 2, s.vdim});
  for (Tensor* t : {&query, &key, &value}) {
    for (int64_t i = 0; i < t->num_elements(); ++i) t->mutable_as<float>()[i] = 0.25f * (i % 5);
  }
  MhaInputs in;
  in.query = query.view();
  in.key = key.view();
  in.value = value.view();
  in.need_weights = true;
  ASSIGN_OR_RETURN(const MhaOutputs out, (*engine)->Forward(in));
  const Shape weights_shape = {1, 3, 2 + s.extra_keys()};
  if (out.output.shape() != Shape{1, 3, s.embed_dim} || !out.attn_weights ||
      out.attn_weights->shape() != weights_shape) {
    return absl::InternalError(absl::StrCat("fuzz invariant: forward output ",
                                            ShapeToString(out.output.shape()), ", expected [1, 3, ",
                                            s.embed_dim, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FuzzOneModelDir(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  size_t config_len = 0;
  if (size >= 2) config_len = data[0] | static_cast<size_t>(data[1]) << 8;
  const absl::string_view rest = bytes.substr(size >= 2 ? 2 : size);
  const absl::string_view config = rest.substr(0, config_len);
  const absl::string_view safetensors = rest.substr(config.size());
  ASSIGN_OR_RETURN(auto model, MhaModel::FromBytes(config, safetensors));
  const MhaSpec& s = model->spec();
  if (s.embed_dim * (s.embed_dim + s.kdim + s.vdim) > kMaxRunWeights) return absl::OkStatus();
  return RunOnce(std::move(model));
}

}  // namespace attention::fuzz
