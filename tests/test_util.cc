#include "tests/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "core/safetensors.h"

namespace attention::testing {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double At(const TensorView& t, int64_t i) { return LoadAsFloat(t.dtype, t.data, i); }

double MaskValue(const TensorView& t, int64_t i) {
  if (t.dtype == DType::kBool) return At(t, i) != 0 ? kNegInf : 0.0;
  return At(t, i);
}

// y[r][o] = sum_c x[r][c] W[o][c] + b[o].
std::vector<double> Project(const TensorView& x, int64_t row0, int64_t rows, const Tensor& w,
                            const float* bias) {
  const int64_t out = w.dim(0), in = w.dim(1);
  std::vector<double> y(rows * out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = bias ? bias[o] : 0.0;
      for (int64_t c = 0; c < in; ++c)
        acc += At(x, (row0 + r) * in + c) * w.as<float>()[o * in + c];
      y[r * out + o] = acc;
    }
  }
  return y;
}

}  // namespace

Reference ReferenceMha(const MhaModel& model, const MhaInputs& in) {
  const MhaSpec& s = model.spec();
  const MhaWeights& w = model.weights();
  const int64_t e = s.embed_dim, heads = s.num_heads, d = s.head_dim();
  const bool batched = in.query.rank() == 3;
  const int64_t n_items = batched ? in.query.dim(0) : 1;
  const int64_t l = in.query.dim(batched ? 1 : 0);
  const TensorView& key = in.key ? *in.key : in.query;
  const TensorView& value = in.value ? *in.value : key;
  const int64_t keys = key.dim(batched ? 1 : 0);
  const int64_t total = keys + s.extra_keys();
  const float* in_bias = s.bias ? w.in_bias.as<float>() : nullptr;

  Reference ref;
  ref.output.assign(n_items * l * e, 0.0);
  ref.weights.assign(n_items * heads * l * total, 0.0);
  for (int64_t n = 0; n < n_items; ++n) {
    std::vector<double> q = Project(in.query, n * l, l, w.q_weight, in_bias);
    std::vector<double> k =
        Project(key, n * keys, keys, w.k_weight, in_bias ? in_bias + e : nullptr);
    std::vector<double> v =
        Project(value, n * keys, keys, w.v_weight, in_bias ? in_bias + 2 * e : nullptr);
    k.resize(total * e, 0.0);
    v.resize(total * e, 0.0);
    if (s.add_bias_kv) {
      for (int64_t c = 0; c < e; ++c) {
        k[keys * e + c] = w.bias_k.as<float>()[c];
        v[keys * e + c] = w.bias_v.as<float>()[c];
      }
    }
    std::vector<double> ctx(l * e, 0.0);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < l; ++i) {
        std::vector<double> score(total);
        for (int64_t j = 0; j < total; ++j) {
          double acc = 0.0;
          for (int64_t c = 0; c < d; ++c) acc += q[i * e + h * d + c] * k[j * e + h * d + c];
          score[j] = acc / std::sqrt(static_cast<double>(d));
          if (j >= keys) continue;  // Appended keys are always attendable.
          if (in.key_padding_mask) score[j] += MaskValue(*in.key_padding_mask, n * keys + j);
          if (in.attn_mask) {
            const int64_t plane = in.attn_mask->rank() == 3 ? (n * heads + h) * l * keys : 0;
            score[j] += MaskValue(*in.attn_mask, plane + i * keys + j);
          }
          if (in.is_causal && j > i) score[j] = kNegInf;
        }
        const double m = *std::max_element(score.begin(), score.end());
        double* p = &ref.weights[((n * heads + h) * l + i) * total];
        if (m == kNegInf) continue;  // Fully masked: zero weights, zero context.
        double sum = 0.0;
        for (int64_t j = 0; j < total; ++j) sum += (p[j] = std::exp(score[j] - m));
        for (int64_t j = 0; j < total; ++j) p[j] /= sum;
        for (int64_t j = 0; j < total; ++j) {
          for (int64_t c = 0; c < d; ++c) ctx[i * e + h * d + c] += p[j] * v[j * e + h * d + c];
        }
      }
    }
    const float* out_bias = s.bias ? w.out_bias.as<float>() : nullptr;
    for (int64_t i = 0; i < l; ++i) {
      for (int64_t o = 0; o < e; ++o) {
        double acc = out_bias ? out_bias[o] : 0.0;
        for (int64_t c = 0; c < e; ++c) acc += ctx[i * e + c] * w.out_weight.as<float>()[o * e + c];
        ref.output[(n * l + i) * e + o] = acc;
      }
    }
  }
  return ref;
}

Tensor RandomTensor(Shape shape, std::mt19937& rng, float scale) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::normal_distribution<float> normal(0.0f, scale);
  float* p = t.mutable_as<float>();
  for (int64_t i = 0; i < t.num_elements(); ++i) p[i] = normal(rng);
  return t;
}

Tensor RandomMask(Shape shape, std::mt19937& rng, double p) {
  Tensor t(DType::kBool, std::move(shape));
  std::bernoulli_distribution coin(p);
  uint8_t* m = t.mutable_as<uint8_t>();
  for (int64_t i = 0; i < t.num_elements(); ++i) m[i] = coin(rng) ? 1 : 0;
  return t;
}

void WriteModelDir(const MhaModel& model, const std::string& dir, const std::string& extra_config) {
  const MhaSpec& s = model.spec();
  const MhaWeights& w = model.weights();
  std::filesystem::create_directories(dir);
  Tensor in_proj, bias_k, bias_v;
  std::map<std::string, const Tensor*> tensors = {{"out_proj.weight", &w.out_weight}};
  if (s.packed_in_proj()) {
    const int64_t e = s.embed_dim;
    in_proj = Tensor(DType::kFloat32, {3 * e, e});
    std::memcpy(in_proj.mutable_as<float>(), w.q_weight.data(), w.q_weight.num_bytes());
    std::memcpy(in_proj.mutable_as<float>() + e * e, w.k_weight.data(), w.k_weight.num_bytes());
    std::memcpy(in_proj.mutable_as<float>() + 2 * e * e, w.v_weight.data(), w.v_weight.num_bytes());
    tensors["in_proj_weight"] = &in_proj;
  } else {
    tensors["q_proj_weight"] = &w.q_weight;
    tensors["k_proj_weight"] = &w.k_weight;
    tensors["v_proj_weight"] = &w.v_weight;
  }
  if (s.bias) {
    tensors["in_proj_bias"] = &w.in_bias;
    tensors["out_proj.bias"] = &w.out_bias;
  }
  if (s.add_bias_kv) {
    bias_k = w.bias_k.Clone();
    bias_v = w.bias_v.Clone();
    (void)bias_k.Reshape({1, 1, s.embed_dim});
    (void)bias_v.Reshape({1, 1, s.embed_dim});
    tensors["bias_k"] = &bias_k;
    tensors["bias_v"] = &bias_v;
  }
  std::ofstream(dir + "/model.safetensors", std::ios::binary) << WriteSafeTensors(tensors);
  std::ofstream(dir + "/config.json")
      << "{\"num_heads\": " << s.num_heads
      << ", \"add_zero_attn\": " << (s.add_zero_attn ? "true" : "false")
      << ", \"compute_dtype\": \"" << (s.int8_weights ? "int8" : DTypeName(s.compute_dtype)) << "\""
      << (extra_config.empty() ? "" : ", ") << extra_config << "}";
}

double MaxExcess(const float* actual, const std::vector<double>& expected, double rtol) {
  double worst = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double diff = std::abs(actual[i] - expected[i]);
    if (std::isnan(actual[i])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, diff - rtol * std::abs(expected[i]));
  }
  return worst;
}

}  // namespace attention::testing
