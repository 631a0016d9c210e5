#include "tests/fuzz/session_oracle.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace attention::fuzz {
namespace {

constexpr double kFloat32Tolerance = 1e-4;
constexpr double kBFloat16Tolerance = 4e-2;

absl::Status Bug(absl::string_view what) {
  return absl::InternalError(absl::StrCat("fuzz invariant: ", what));
}

// `width` values of the session (`got`) against the stateless row (`want`);
// a row the oracle gives NaN for is not compared.
absl::Status CompareRow(absl::string_view what, int64_t row, const float* got, const float* want,
                        int64_t width, double tolerance) {
  double scale = 0;
  for (int64_t j = 0; j < width; ++j) {
    if (std::isnan(want[j])) return absl::OkStatus();
    scale = std::max(scale, static_cast<double>(std::abs(want[j])));
  }
  const double limit = tolerance * (1.0 + scale);
  for (int64_t j = 0; j < width; ++j) {
    if (!(std::abs(static_cast<double>(got[j]) - want[j]) <= limit)) {
      return Bug(absl::StrCat(what, " row ", row, " column ", j, ": session ", got[j],
                              ", stateless ", want[j], " (limit ", limit, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void SessionHistory::Append(const std::vector<float>& step_rows, const std::vector<uint8_t>& flags,
                            int64_t t) {
  rows.insert(rows.end(), step_rows.begin(), step_rows.end());
  if (!cross) {
    masked = masked || !flags.empty();
    for (int64_t i = 0; i < t; ++i) not_key.push_back(flags.empty() ? 0 : flags[i]);
  }
  length_ += t;
}

absl::Status CheckRefusal(const absl::Status& status, absl::StatusCode expected) {
  if (status.code() != expected) {
    if (status.code() == absl::StatusCode::kInvalidArgument ||
        status.code() == absl::StatusCode::kResourceExhausted) {
      return Bug(absl::StrCat("expected ", absl::StatusCodeToString(expected), ", got ",
                              status.ToString()));
    }
    return status;
  }
  if (status.message().empty()) return Bug(absl::StrCat(status.ToString(), " has no message"));
  return absl::OkStatus();
}

absl::Status CheckStep(const MhaEngine& engine, DType cache_dtype, const SessionHistory& history,
                       const StepResult& step) {
  const MhaSpec& spec = engine.model().spec();
  const int64_t e = spec.embed_dim, heads = spec.num_heads;
  const int64_t before = history.length();
  const int64_t t = static_cast<int64_t>(step.rows.size()) / e;
  const int64_t length = before + t;
  std::vector<float> queries = history.rows;
  queries.insert(queries.end(), step.rows.begin(), step.rows.end());
  MhaInputs in;
  in.query = TensorView{DType::kFloat32, {1, length, e}, queries.data()};
  std::vector<uint8_t> mask;
  if (history.cross) {
    const Tensor& k = history.key;
    const Tensor& v = history.value;
    in.key = TensorView{k.dtype(), {1, k.dim(0), k.dim(1)}, k.data()};
    in.value = TensorView{v.dtype(), {1, v.dim(0), v.dim(1)}, v.data()};
    if (history.key_padding_mask) {
      const Tensor& m = *history.key_padding_mask;
      in.key_padding_mask = TensorView{m.dtype(), {1, m.dim(0)}, m.data()};
    }
    in.is_causal = history.is_causal;
  } else {
    if (history.masked || !step.flags.empty()) {
      mask = history.not_key;
      for (int64_t i = 0; i < t; ++i) mask.push_back(step.flags.empty() ? 0 : step.flags[i]);
      in.key_padding_mask = TensorView{DType::kBool, {1, length}, mask.data()};
    }
    in.is_causal = true;
  }
  in.need_weights = step.need_weights;
  in.average_attn_weights = step.average_weights;
  const absl::StatusOr<MhaOutputs> stateless = engine.Forward(in);
  if (!stateless.ok()) {
    return Bug(absl::StrCat("the stateless forward refused what the ",
                            history.cross ? "cross" : "self",
                            " session computed: ", stateless.status().ToString()));
  }
  const double tolerance = spec.compute_dtype == DType::kFloat32 && cache_dtype == DType::kFloat32
                               ? kFloat32Tolerance
                               : kBFloat16Tolerance;
  const float* out = stateless->output.as<float>();
  for (int64_t i = 0; i < t; ++i) {
    RETURN_IF_ERROR(CompareRow("output", before + i, step.output + i * e, out + (before + i) * e, e,
                               tolerance));
  }
  if (!step.need_weights) return absl::OkStatus();
  const Tensor& w = *stateless->attn_weights;
  const int64_t columns = w.dim(w.rank() - 1);
  const float* want = w.as<float>();
  for (int64_t h = 0; h < (step.average_weights ? 1 : heads); ++h) {
    const std::string what =
        step.average_weights ? "averaged weights" : absl::StrCat("head ", h, " weights");
    for (int64_t i = 0; i < t; ++i) {
      RETURN_IF_ERROR(CompareRow(what, before + i, step.weights + (h * t + i) * columns,
                                 want + (h * length + before + i) * columns, columns, tolerance));
    }
  }
  return absl::OkStatus();
}

}  // namespace attention::fuzz
