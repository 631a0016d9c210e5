#include "server/requests/wire_layout.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/input_validation.h"
#include "core/status_macros.h"

namespace attention::server {
namespace {

constexpr absl::string_view kLayoutNote =
    " (the model takes PyTorch's batch_first=False layout: query (L, N, E), key (S, N, kdim), "
    "value (S, N, vdim))";

std::string Dims(const Shape& expected) {
  std::string s = "[";
  for (size_t i = 0; i < expected.size(); ++i) {
    absl::StrAppend(&s, i ? ", " : "", expected[i] < 0 ? "*" : absl::StrCat(expected[i]));
  }
  return s + "]";
}

// `t` is a float tensor of rank 3 with positive dims and the `expected` dims
// (-1: any); else InvalidArgument naming it with `layout`, e.g. "(L, N, E)".
absl::Status CheckSequenceFirst(const TensorView& t, absl::string_view name,
                                absl::string_view layout, const Shape& expected) {
  absl::Status status = CheckFloatTensor(t, name, 3);  // Dtype, rank, data.
  if (status.ok() && !CheckShape(t, name, expected).ok()) {
    status = absl::InvalidArgumentError(absl::StrCat(
        name, ": expected shape ", layout, " ", Dims(expected), ", got ", ShapeToString(t.shape)));
  }
  if (status.ok()) return status;
  return absl::InvalidArgumentError(absl::StrCat(status.message(), kLayoutNote));
}

// `t` with its first two dims swapped: a batch-first view of its shape (the
// bytes stay in the sequence-first order; only the batch runner reads them).
TensorView Swapped(TensorView t) {
  std::swap(t.shape[0], t.shape[1]);
  return t;
}

}  // namespace

bool SequenceFirst(const MhaEngine& engine) { return !engine.model().serving().batch_first; }

absl::StatusOr<MhaCall> ValidateInWireLayout(const MhaEngine& engine, const MhaInputs& in,
                                             bool* sequence_first) {
  *sequence_first = false;
  if (!SequenceFirst(engine) || in.query.rank() == 2) return engine.Validate(in);
  const MhaSpec& s = engine.model().spec();
  if (in.query.rank() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("query: expected rank 3 (L, N, E) or 2 (L, E), got shape ",
                     ShapeToString(in.query.shape), kLayoutNote));
  }
  RETURN_IF_ERROR(CheckSequenceFirst(in.query, "query", "(L, N, E)", {-1, -1, s.embed_dim}));
  const int64_t n = in.query.dim(1);
  int64_t keys = in.query.dim(0);
  if (in.key) {
    RETURN_IF_ERROR(CheckSequenceFirst(*in.key, "key", "(S, N, kdim)", {-1, n, s.kdim}));
    keys = in.key->dim(0);
  }
  if (in.key || !in.value) {  // A value without a key is refused by Validate.
    const TensorView& value = in.value ? *in.value : in.key ? *in.key : in.query;
    RETURN_IF_ERROR(CheckSequenceFirst(value, "value", "(S, N, vdim)", {keys, n, s.vdim}));
  }
  // The rest (masks, dtypes, what the model needs) does not depend on the
  // layout: the engine's own checks, on a batch-first view of the shapes.
  MhaInputs view = in;
  view.query = Swapped(in.query);
  if (in.key) view.key = Swapped(*in.key);
  if (in.value && in.key) view.value = Swapped(*in.value);
  ASSIGN_OR_RETURN(MhaCall call, engine.Validate(view));
  *sequence_first = true;
  return call;
}

}  // namespace attention::server
