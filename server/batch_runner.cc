#include "server/batch_runner.h"

#include <algorithm>
#include <cstring>

namespace attention::server {
namespace {

// Copies an item's (rows, features) block into a zero-padded float32 batch
// buffer whose items hold `padded_rows` rows.
void CopyItem(const TensorView& src, int64_t item, int64_t rows, int64_t features, float* dst,
              int64_t dst_item, int64_t padded_rows) {
  const size_t esize = DTypeSize(src.dtype);
  const char* from = static_cast<const char*>(src.data) + item * rows * features * esize;
  ConvertFloats(src.dtype, from, DType::kFloat32, dst + dst_item * padded_rows * features,
                static_cast<size_t>(rows * features));
}

}  // namespace

double ForwardFlops(const MhaSpec& s, int64_t items, int64_t queries, int64_t keys) {
  const double n = static_cast<double>(items), l = static_cast<double>(queries),
               k = static_cast<double>(keys), e = static_cast<double>(s.embed_dim);
  const double total_keys = k + static_cast<double>(s.extra_keys());
  return 4.0 * n * l * e * e + 2.0 * n * k * (s.kdim + s.vdim) * e + 4.0 * n * l * total_keys * e;
}

std::vector<RequestOutcome> RunBatch(const MhaEngine& engine,
                                     const std::vector<std::unique_ptr<PendingRequest>>& batch,
                                     BatchStats* stats) {
  const MhaSpec& s = engine.model().spec();
  const int64_t e = s.embed_dim, heads = s.num_heads;
  const bool self_attention = batch.front()->call.self_attention;
  int64_t items = 0, max_l = 0, max_s = 0;
  bool any_weights = false;
  for (const auto& r : batch) {
    items += r->call.batch;
    max_l = std::max(max_l, r->call.queries);
    max_s = std::max(max_s, r->call.keys);
    any_weights |= r->inputs.need_weights;
    stats->real_tokens += r->tokens();
  }
  stats->padded_tokens = items * max_l;
  stats->flops = ForwardFlops(s, items, max_l, self_attention ? max_l : max_s);

  // Padded inputs and per-item masks.
  Tensor query(DType::kFloat32, {items, max_l, e});
  Tensor key, value;
  if (!self_attention) {
    key = Tensor(DType::kFloat32, {items, max_s, s.kdim});
    value = Tensor(DType::kFloat32, {items, max_s, s.vdim});
  }
  std::vector<ItemMask> masks;
  masks.reserve(items);
  int64_t item = 0;
  for (const auto& r : batch) {
    const MhaCall& c = r->call;
    for (int64_t i = 0; i < c.batch; ++i, ++item) {
      CopyItem(r->inputs.query, i, c.queries, e, query.mutable_as<float>(), item, max_l);
      if (!self_attention) {
        const TensorView& v = r->inputs.value ? *r->inputs.value : *r->inputs.key;
        CopyItem(*r->inputs.key, i, c.keys, s.kdim, key.mutable_as<float>(), item, max_s);
        CopyItem(v, i, c.keys, s.vdim, value.mutable_as<float>(), item, max_s);
      }
      masks.push_back(c.items[i]);
    }
  }

  const int64_t keys = self_attention ? max_l : max_s;
  const int64_t total_keys = keys + s.extra_keys();
  std::vector<float> output(static_cast<size_t>(items * max_l * e));
  std::vector<float> weights(any_weights ? static_cast<size_t>(items * heads * max_l * total_keys)
                                         : 0);
  std::optional<TensorView> key_view, value_view;
  if (!self_attention) {
    key_view = key.view();
    value_view = value.view();
  }
  const absl::Status status =
      engine.ForwardBatch(query.view(), key_view, value_view, masks, output.data(),
                          any_weights ? weights.data() : nullptr);

  std::vector<RequestOutcome> outcomes(batch.size());
  item = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const PendingRequest& r = *batch[b];
    const MhaCall& c = r.call;
    RequestOutcome& out = outcomes[b];
    out.status = status;
    out.batch_requests = static_cast<int>(batch.size());
    if (!status.ok()) continue;
    const DType out_dtype = r.inputs.output_dtype.value_or(r.inputs.query.dtype);
    const int64_t l = c.queries, own_keys = c.keys, own_total = own_keys + s.extra_keys();
    Tensor out32(DType::kFloat32, {c.batch, l, e});
    Tensor w32;
    const bool per_head = !r.inputs.average_attn_weights;
    if (r.inputs.need_weights) {
      w32 = per_head ? Tensor(DType::kFloat32, {c.batch, heads, l, own_total})
                     : Tensor(DType::kFloat32, {c.batch, l, own_total});
    }
    for (int64_t i = 0; i < c.batch; ++i, ++item) {
      std::memcpy(out32.mutable_as<float>() + i * l * e, output.data() + item * max_l * e,
                  l * e * sizeof(float));
      if (!r.inputs.need_weights) continue;
      float* dst = w32.mutable_as<float>();
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t q = 0; q < l; ++q) {
          const float* row = weights.data() + ((item * heads + h) * max_l + q) * total_keys;
          float* to = per_head ? dst + ((i * heads + h) * l + q) * own_total
                               : dst + (i * l + q) * own_total;
          // The item's own keys, then the appended ones (stored after padding).
          for (int64_t j = 0; j < own_total; ++j) {
            const float w = row[j < own_keys ? j : keys + (j - own_keys)];
            to[j] = per_head ? w : to[j] + w / static_cast<float>(heads);
          }
        }
      }
    }
    Shape out_shape = r.inputs.query.shape;
    (void)out32.Reshape(out_shape);
    out.output = out_dtype == DType::kFloat32 ? std::move(out32) : out32.ConvertTo(out_dtype);
    if (r.inputs.need_weights) {
      Shape wshape = w32.shape();
      if (!c.batched) {
        wshape.erase(wshape.begin());
        (void)w32.Reshape(wshape);
      }
      out.attn_weights = out_dtype == DType::kFloat32 ? std::move(w32) : w32.ConvertTo(out_dtype);
    }
  }
  return outcomes;
}

}  // namespace attention::server
