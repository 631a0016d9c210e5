#include "server/batching/warmup.h"

#include <utility>
#include <vector>

#include "core/status_macros.h"

namespace attention::server {

absl::Status WarmUp(const MhaEngine& engine, const std::function<bool()>& abandoned) {
  const MhaSpec& s = engine.model().spec();
  // One item of each common length, and a batch of two (its strided paths
  // JIT-compile oneDNN kernels on first use, ~0.1 s).
  for (auto [items, len] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {1, 8}, {1, 16}, {1, 32}, {1, 64}, {1, 128}, {2, 8}, {2, 32}}) {
    if (abandoned && abandoned()) return absl::CancelledError("warm-up abandoned");
    Tensor q(DType::kFloat32, {items, len, s.embed_dim});
    Tensor k(DType::kFloat32, {items, len, s.kdim});
    Tensor v(DType::kFloat32, {items, len, s.vdim});
    Tensor mask(DType::kBool, {items, len});
    MhaInputs in;
    in.query = q.view();
    if (!s.packed_in_proj()) {
      in.key = k.view();
      in.value = v.view();
    }
    if (items > 1) in.key_padding_mask = mask.view();  // The masked kernels too.
    RETURN_IF_ERROR(engine.Forward(in).status());
  }
  return absl::OkStatus();
}

}  // namespace attention::server
