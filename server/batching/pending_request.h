// File: server/batching/pending_request.h
//
// A validated request on its way through a model's queue and batch, and what
// comes back. The batcher owns a PendingRequest from Enqueue() until it calls
// `done`, exactly once, on its own thread.
#ifndef ATTENTION_SERVER_BATCHING_PENDING_REQUEST_H_
#define ATTENTION_SERVER_BATCHING_PENDING_REQUEST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/memory_meter.h"
#include "core/mha_engine.h"
#include "core/session_engine.h"
#include "core/tensor.h"

namespace attention::server {

// A result in its wire form: the encoder moves `bytes` into the response
// message without copying them again.
struct OutputTensor {
  DType dtype = DType::kFloat32;
  Shape shape;
  std::string bytes;   // product(shape) elements of dtype, row-major.
  MeterCharge charge;  // The bytes, on the MemoryMeter, until encoded.

  // A tensor of `shape` in `dtype` whose bytes the caller fills.
  static OutputTensor Sized(DType dtype, Shape shape) {
    OutputTensor t;
    t.dtype = dtype;
    const size_t size = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
    t.bytes.resize(size);
    t.charge = MeterCharge(static_cast<int64_t>(size));
    t.shape = std::move(shape);
    return t;
  }
};

struct RequestOutcome {
  absl::Status status;                       // OK, or why the request was not computed.
  OutputTensor output;                       // The query's shape, in the output dtype.
  std::optional<OutputTensor> attn_weights;  // When asked.
  int64_t queue_us = 0;                      // Enqueue to batch start.
  int64_t compute_us = 0;                    // The batch's compute time.
  int batch_requests = 0;                    // Requests in the executed batch.
  int64_t session_length = 0;                // Session work: the session's length after it.
  // Sequence steps: the version of the sequence's session, which computed it
  // (the request may have resolved another); 0: the version it was admitted to.
  int64_t model_version = 0;
};

// Whom a request is queued for: the caller's token (its Principal), so that
// FairQueue serves tenants fairly. Copying it copies one reference count;
// `id` and `name` borrow the strings `owner` keeps alive.
struct TenantTag {
  std::shared_ptr<const void> owner;  // The caller's Principal; null: static strings.
  absl::string_view id;               // Principal::id; "": the one tenant without tokens.
  absl::string_view name = "-";       // Principal::name: the metrics label.
  int64_t weight = 1;                 // The token's weight= (1 to 1000).
};

struct Session;
struct TenantSeries;  // server/metrics/tenant_metrics.h
class Admission;
class OutcomeFlush;  // server/batching/outcome_flush.h

// A session's step, queued and batched like a request: an append, or a cross
// session's creation (projecting its fixed keys and values).
struct SessionWork {
  enum class Kind { kAppend, kInitCross };
  Kind kind = Kind::kAppend;
  std::shared_ptr<Session> session;
  TensorView tokens;                  // Append: (T, E).
  std::optional<TensorView> not_key;  // Append, self sessions: (T) bool.
  CrossKeys cross;                    // kInitCross.
  int64_t key_count = 0;              // kInitCross: S.
  // Appends: checked again when the append runs, against the session's
  // length then (an append is applied if and only if its response is OK).
  int64_t max_response_bytes = 0;  // The server's max_message_bytes.
  int64_t id_bytes = 0;            // Echoed ids in the response.
  int64_t request_bytes = 0;       // The request message, held while queued.
  // Appends: the session's length the client expects when it runs (a
  // mismatch fails it, unapplied, with FAILED_PRECONDITION); unset: any.
  std::optional<int64_t> expected_length;
  // The in-flight budget held for it (null in tests without a server),
  // grown when the exact response is larger than the estimate. Owned by the
  // front-end, which holds it until the response is sent.
  Admission* admission = nullptr;
  // Takes the append's tokens off its session's queued_tokens when the work
  // goes (its deleter does; it holds no object).
  std::shared_ptr<void> queued;
};

struct PendingRequest {
  std::shared_ptr<const void> keep_alive;  // Owns the bytes the views borrow.
  // The model version it was admitted to, kept until it is answered (the
  // repository frees a version when its last lease goes).
  std::shared_ptr<const void> version_lease;
  MhaInputs inputs;  // Views of the request's tensors.
  MhaCall call;      // From MhaEngine::Validate.
  // The model takes PyTorch's batch_first=False layout (config.json
  // "batch_first": false): the batched query, key and value in `inputs` are
  // (L, N, E), (S, N, kdim), (S, N, vdim) as sent, and the output goes back
  // (L, N, E); `call` counts N, L and S all the same. The batch runner reads
  // and writes the rows in this order while it pads the batch (the engine
  // stays batch-first). Masks and attention weights are the same either way.
  bool sequence_first = false;
  absl::Time enqueued = absl::InfinitePast();
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> is_cancelled;  // Optional; polled while queued.
  std::function<void(RequestOutcome)> done;
  // Optional, not owned: told once after the `done` calls of the batch (or
  // of the dropped requests) this request went with (see OutcomeFlush).
  OutcomeFlush* flush = nullptr;
  // Set for session work, which is batched only with session work; `inputs`
  // then carries need_weights, average_attn_weights and output_dtype, and
  // `call` the token count (batch 1, queries T).
  std::unique_ptr<SessionWork> session;
  // Session work: an upper bound of the working memory computing it takes
  // (the batcher keeps a batch's sum under its cap).
  int64_t working_bytes = 0;
  TenantTag tenant;
  // Its work in FLOPs, the fair queue's cost; 0: the batcher computes it
  // from `call` (ForwardFlops).
  double cost = 0;
  // Set by the fair queue: the tenant's series, for the wait and work it
  // observes when the request is computed (null without metrics).
  const TenantSeries* tenant_series = nullptr;

  // Real query tokens: items x query length.
  int64_t tokens() const { return call.batch * call.queries; }
  // Real key tokens: items x key length (the query length for self-attention).
  int64_t key_tokens() const { return call.batch * call.keys; }
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_PENDING_REQUEST_H_
