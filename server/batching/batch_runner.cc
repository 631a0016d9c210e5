#include "server/batching/batch_runner.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/workspace.h"

namespace attention::server {
namespace {

// Copies an item's (rows, features) block into a float32 batch buffer whose
// items hold `padded_rows` rows, and zeroes the padding rows: they are
// masked or ignored, but stale bytes could hold NaN, and 0 x NaN is NaN.
// `src` is (N, rows, features), or with `sequence_first` (rows, N, features):
// the item's rows are then N rows apart.
void CopyItem(const TensorView& src, bool sequence_first, int64_t item, int64_t rows,
              int64_t features, float* dst, int64_t dst_item, int64_t padded_rows) {
  const size_t esize = DTypeSize(src.dtype);
  const char* base = static_cast<const char*>(src.data);
  float* to = dst + dst_item * padded_rows * features;
  if (!sequence_first) {
    ConvertFloats(src.dtype, base + item * rows * features * esize, DType::kFloat32, to,
                  static_cast<size_t>(rows * features));
  } else {
    const int64_t items = src.dim(1);
    for (int64_t r = 0; r < rows; ++r) {
      ConvertFloats(src.dtype, base + (r * items + item) * features * esize, DType::kFloat32,
                    to + r * features, static_cast<size_t>(features));
    }
  }
  std::memset(to + rows * features, 0,
              static_cast<size_t>((padded_rows - rows) * features) * sizeof(float));
}

}  // namespace

double ForwardFlops(const MhaSpec& s, int64_t items, int64_t queries, int64_t keys) {
  const double n = static_cast<double>(items), l = static_cast<double>(queries),
               k = static_cast<double>(keys), e = static_cast<double>(s.embed_dim);
  const double total_keys = k + static_cast<double>(s.extra_keys());
  return 4.0 * n * l * e * e + 2.0 * n * k * (s.kdim + s.vdim) * e + 4.0 * n * l * total_keys * e;
}

int64_t BatchWorkingBytes(const MhaEngine& engine, int64_t items, int64_t queries, int64_t keys,
                          bool self_attention, bool need_weights) {
  const MhaSpec& s = engine.model().spec();
  const int64_t f32 = static_cast<int64_t>(sizeof(float));
  int64_t bytes = 2 * items * queries * s.embed_dim * f32;  // Query and output.
  if (!self_attention) bytes += items * keys * (s.kdim + s.vdim) * f32;
  if (need_weights) bytes += items * s.num_heads * queries * (keys + s.extra_keys()) * f32;
  // The masks, and the row that gathers one request's weights.
  bytes += items * static_cast<int64_t>(sizeof(ItemMask)) + (keys + s.extra_keys()) * f32;
  return bytes + engine.WorkingBytes(items, queries, self_attention ? queries : keys,
                                     self_attention, need_weights);
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

  // Padded inputs and per-item masks, in this thread's reused buffers.
  const int64_t keys = self_attention ? max_l : max_s;
  const int64_t total_keys = keys + s.extra_keys();
  auto floats = [](int64_t n) { return static_cast<size_t>(n) * sizeof(float); };
  Workspace query(Workspace::kBatchQuery, floats(items * max_l * e));
  Workspace key(Workspace::kBatchKey, self_attention ? 0 : floats(items * max_s * s.kdim));
  Workspace value(Workspace::kBatchValue, self_attention ? 0 : floats(items * max_s * s.vdim));
  Workspace output(Workspace::kBatchOutput, floats(items * max_l * e));
  Workspace weights(Workspace::kBatchWeights,
                    any_weights ? floats(items * heads * max_l * total_keys) : 0);
  std::vector<ItemMask> masks;
  masks.reserve(items);
  int64_t item = 0;
  for (const auto& r : batch) {
    const MhaCall& c = r->call;
    for (int64_t i = 0; i < c.batch; ++i, ++item) {
      const bool seq = r->sequence_first;
      CopyItem(r->inputs.query, seq, i, c.queries, e, query.as<float>(), item, max_l);
      if (!self_attention) {
        const TensorView& v = r->inputs.value ? *r->inputs.value : *r->inputs.key;
        CopyItem(*r->inputs.key, seq, i, c.keys, s.kdim, key.as<float>(), item, max_s);
        CopyItem(v, seq, i, c.keys, s.vdim, value.as<float>(), item, max_s);
      }
      masks.push_back(c.items[i]);
    }
  }

  std::optional<TensorView> key_view, value_view;
  if (!self_attention) {
    key_view = TensorView{DType::kFloat32, {items, max_s, s.kdim}, key.data()};
    value_view = TensorView{DType::kFloat32, {items, max_s, s.vdim}, value.data()};
  }
  const absl::Status status = engine.ForwardBatch(
      TensorView{DType::kFloat32, {items, max_l, e}, query.data()}, key_view, value_view, masks,
      output.as<float>(), any_weights ? weights.as<float>() : nullptr);

  // Each request's rows, converted straight into its response bytes.
  std::vector<RequestOutcome> outcomes(batch.size());
  std::vector<float> averaged;
  item = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const PendingRequest& r = *batch[b];
    const MhaCall& c = r.call;
    RequestOutcome& out = outcomes[b];
    out.status = status;
    out.batch_requests = static_cast<int>(batch.size());
    if (!status.ok()) continue;
    const DType out_dtype = r.inputs.output_dtype.value_or(r.inputs.query.dtype);
    const size_t out_size = DTypeSize(out_dtype);
    const int64_t l = c.queries, own_keys = c.keys, own_total = own_keys + s.extra_keys();
    // The query's shape as sent: (N, L, E), (L, E), or (L, N, E) when
    // sequence_first (each item's rows then N rows apart).
    out.output = OutputTensor::Sized(out_dtype, r.inputs.query.shape);
    const bool per_head = !r.inputs.average_attn_weights;
    if (r.inputs.need_weights) {
      Shape wshape = per_head ? Shape{c.batch, heads, l, own_total} : Shape{c.batch, l, own_total};
      if (!c.batched) wshape.erase(wshape.begin());
      out.attn_weights = OutputTensor::Sized(out_dtype, std::move(wshape));
      averaged.resize(static_cast<size_t>(own_total));
    }
    for (int64_t i = 0; i < c.batch; ++i, ++item) {
      if (!r.sequence_first) {
        ConvertFloats(DType::kFloat32, output.as<float>() + item * max_l * e, out_dtype,
                      out.output.bytes.data() + i * l * e * out_size, static_cast<size_t>(l * e));
      } else {
        for (int64_t q = 0; q < l; ++q) {
          ConvertFloats(DType::kFloat32, output.as<float>() + (item * max_l + q) * e, out_dtype,
                        out.output.bytes.data() + (q * c.batch + i) * e * out_size,
                        static_cast<size_t>(e));
        }
      }
      if (!r.inputs.need_weights) continue;
      char* dst = out.attn_weights->bytes.data();
      // Row q of head h: the item's own keys, then the appended ones (stored
      // after the padding).
      auto row = [&](int64_t h, int64_t q) {
        return weights.as<float>() + ((item * heads + h) * max_l + q) * total_keys;
      };
      auto own = [&](int64_t j) { return j < own_keys ? j : keys + (j - own_keys); };
      for (int64_t q = 0; q < l; ++q) {
        if (per_head) {
          for (int64_t h = 0; h < heads; ++h) {
            const float* from = row(h, q);
            for (int64_t j = 0; j < own_total; ++j) averaged[j] = from[own(j)];
            ConvertFloats(DType::kFloat32, averaged.data(), out_dtype,
                          dst + ((i * heads + h) * l + q) * own_total * out_size,
                          static_cast<size_t>(own_total));
          }
          continue;
        }
        std::fill(averaged.begin(), averaged.end(), 0.0f);
        for (int64_t h = 0; h < heads; ++h) {
          const float* from = row(h, q);
          for (int64_t j = 0; j < own_total; ++j) {
            averaged[j] += from[own(j)] / static_cast<float>(heads);
          }
        }
        ConvertFloats(DType::kFloat32, averaged.data(), out_dtype,
                      dst + (i * l + q) * own_total * out_size, static_cast<size_t>(own_total));
      }
    }
  }
  return outcomes;
}

}  // namespace attention::server
