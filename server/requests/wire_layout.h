// File: server/requests/wire_layout.h
//
// The layout a model's tensors take on the wire. A model exported from a
// torch.nn.MultiheadAttention(batch_first=False) (PyTorch's default, and
// nn.Transformer*Layer's) takes query (L, N, E), key (S, N, kdim), value
// (S, N, vdim) and returns (L, N, E); config.json says so with
// "batch_first": false. Masks keep PyTorch's shapes in both layouts
// (key_padding_mask (N, S); attn_mask (L, S) or (N*H, L, S)), and so do the
// attention weights ((N, L, S') or (N, H, L, S')); unbatched (L, E) inputs
// are the same in both.
//
// The engine (core/) is batch-first: a request keeps its tensors as sent and
// is marked `PendingRequest::sequence_first`; the batch runner reads and
// writes its rows in that order while it pads the batch, so no protocol
// copies or transposes anything. Stateless functions; thread-safe.
#ifndef ATTENTION_SERVER_REQUESTS_WIRE_LAYOUT_H_
#define ATTENTION_SERVER_REQUESTS_WIRE_LAYOUT_H_

#include "absl/status/statusor.h"
#include "core/mha_engine.h"

namespace attention::server {

// True when `engine`'s model takes (L, N, E) tensors (config.json
// "batch_first": false).
bool SequenceFirst(const MhaEngine& engine);

// Checks `in`, as the client sent it, against `engine`'s model in the layout
// the model takes (MhaEngine::Validate's checks). OK: the call's shape (N, L
// and S counted the same in both layouts); *sequence_first is true when the
// batched query, key and value are (L, N, ...) and the batch runner must
// reorder their rows (false for batch-first models and unbatched inputs).
// InvalidArgument naming the tensor with the expected and the actual shape
// (for a batch_first=False model, named in its layout, e.g. "query: expected
// shape (L, N, E) [*, *, 64], got ...") or dtype otherwise.
absl::StatusOr<MhaCall> ValidateInWireLayout(const MhaEngine& engine, const MhaInputs& in,
                                             bool* sequence_first);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_REQUESTS_WIRE_LAYOUT_H_
