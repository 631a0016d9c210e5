#include "server/frontends/protocol/oip_codec.h"

#include "server/requests/identifiers.h"

#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "proto/codec/tensor_codec.h"
#include "server/frontends/protocol/message_limit.h"

namespace attention::server {
namespace {

using Input = inference::ModelInferRequest::InferInputTensor;

constexpr std::array<const char*, 5> kInputNames = {"query", "key", "value", "key_padding_mask",
                                                    "attn_mask"};

absl::StatusOr<DType> ParseDatatype(const std::string& datatype, const std::string& field) {
  if (datatype == "FP32") return DType::kFloat32;
  if (datatype == "BF16") return DType::kBFloat16;
  if (datatype == "FP16") return DType::kFloat16;
  if (datatype == "BOOL") return DType::kBool;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected FP32, FP16, BF16 or BOOL, got '", Shown(datatype), "'"));
}

bool HasTypedContents(const inference::InferTensorContents& c) {
  return c.bool_contents_size() + c.int_contents_size() + c.int64_contents_size() +
             c.uint_contents_size() + c.uint64_contents_size() + c.fp32_contents_size() +
             c.fp64_contents_size() + c.bytes_contents_size() >
         0;
}

// The typed contents of `input` (already known to have some) as a view.
absl::StatusOr<TensorView> TypedView(const Input& input, DType dtype, Shape shape,
                                     const std::string& field) {
  const inference::InferTensorContents& c = input.contents();
  const int64_t others = c.int_contents_size() + c.int64_contents_size() + c.uint_contents_size() +
                         c.uint64_contents_size() + c.fp64_contents_size() +
                         c.bytes_contents_size();
  if (dtype == DType::kFloat32 && others == 0 && c.bool_contents_size() == 0) {
    return wire::CheckedView(dtype, std::move(shape), c.fp32_contents().data(),
                             c.fp32_contents_size() * sizeof(float), field + ".contents");
  }
  if (dtype == DType::kBool && others == 0 && c.fp32_contents_size() == 0) {
    static_assert(sizeof(bool) == 1, "BOOL contents are viewed as one byte per element");
    return wire::CheckedView(dtype, std::move(shape), c.bool_contents().data(),
                             c.bool_contents_size(), field + ".contents");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ".contents: datatype ", input.datatype(),
      dtype == DType::kFloat32 ? " takes fp32_contents only"
      : dtype == DType::kBool  ? " takes bool_contents only"
                               : " has no typed contents field; send raw_input_contents"));
}

absl::StatusOr<bool> BoolParameter(const inference::InferParameter& p, const std::string& name) {
  if (p.parameter_choice_case() != inference::InferParameter::kBoolParam) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameters['", Shown(name), "']: expected bool_param"));
  }
  return p.bool_param();
}

absl::StatusOr<int64_t> IntParameter(const inference::InferParameter& p, const std::string& name) {
  if (p.parameter_choice_case() == inference::InferParameter::kInt64Param) return p.int64_param();
  if (p.parameter_choice_case() == inference::InferParameter::kUint64Param &&
      p.uint64_param() <= static_cast<uint64_t>(INT64_MAX)) {
    return static_cast<int64_t>(p.uint64_param());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("parameters['", Shown(name), "']: expected int64_param or uint64_param"));
}

absl::Status DecodeParameters(const inference::ModelInferRequest& request, OipRequest* out) {
  for (const auto& [name, p] : request.parameters()) {
    if (name == "is_causal") {
      ASSIGN_OR_RETURN(out->inputs.is_causal, BoolParameter(p, name));
    } else if (name == "need_weights") {
      ASSIGN_OR_RETURN(out->inputs.need_weights, BoolParameter(p, name));
    } else if (name == "average_attn_weights") {
      ASSIGN_OR_RETURN(out->inputs.average_attn_weights, BoolParameter(p, name));
    } else if (name == "sequence_start") {
      ASSIGN_OR_RETURN(out->sequence_start, BoolParameter(p, name));
    } else if (name == "sequence_end") {
      ASSIGN_OR_RETURN(out->sequence_end, BoolParameter(p, name));
    } else if (name == "timeout") {
      ASSIGN_OR_RETURN(int64_t us, IntParameter(p, name));
      if (us < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameters['timeout']: expected >= 0 microseconds, got ", us));
      }
      if (us > 0) out->timeout = absl::Microseconds(us);
    } else if (name == "priority") {
      RETURN_IF_ERROR(IntParameter(p, name).status());
    } else if (name == "sequence_id") {
      if (p.parameter_choice_case() == inference::InferParameter::kStringParam) {
        if (!p.string_param().empty()) out->sequence_id = "s:" + p.string_param();
      } else if (p.parameter_choice_case() == inference::InferParameter::kUint64Param) {
        // Triton's ids are uint64: every value is valid, 0 means none.
        if (p.uint64_param() != 0) out->sequence_id = absl::StrCat("n:", p.uint64_param());
      } else {
        ASSIGN_OR_RETURN(int64_t id, IntParameter(p, name));
        if (id != 0) out->sequence_id = absl::StrCat("n:", id);  // 0: no sequence (Triton).
      }
    }
  }
  if ((out->sequence_start || out->sequence_end) && !out->sequence_id) {
    return absl::InvalidArgumentError(
        "parameters['sequence_start'/'sequence_end']: need a non-zero 'sequence_id'");
  }
  return absl::OkStatus();
}

}  // namespace

const char* OipDatatype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "FP32";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat16:
      return "FP16";
    case DType::kBool:
      return "BOOL";
  }
  return "";
}

absl::StatusOr<OipRequest> DecodeModelInfer(const inference::ModelInferRequest& request) {
  OipRequest out;
  const bool raw = request.raw_input_contents_size() > 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("raw_input_contents: expected one entry per input (", request.inputs_size(),
                     "), got ", request.raw_input_contents_size()));
  }
  std::array<std::optional<TensorView>, kInputNames.size()> views;
  for (int i = 0; i < request.inputs_size(); ++i) {
    const Input& input = request.inputs(i);
    const std::string field = absl::StrCat("inputs[", i, "] ('", Shown(input.name()), "')");
    size_t slot = 0;
    while (slot < kInputNames.size() && input.name() != kInputNames[slot]) ++slot;
    if (slot == kInputNames.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: expected one of ", absl::StrJoin(kInputNames, ", ")));
    }
    if (views[slot]) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".name: sent twice"));
    }
    ASSIGN_OR_RETURN(DType dtype, ParseDatatype(input.datatype(), field + ".datatype"));
    Shape shape(input.shape().begin(), input.shape().end());
    const bool typed = HasTypedContents(input.contents());
    if (raw && typed) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ".contents: the request also has raw_input_contents; send every input one "
                       "way, all raw or all typed"));
    }
    if (raw) {
      const std::string& bytes = request.raw_input_contents(i);
      ASSIGN_OR_RETURN(views[slot],
                       wire::CheckedView(dtype, std::move(shape), bytes.data(), bytes.size(),
                                         absl::StrCat("raw_input_contents[", i, "] ('",
                                                      Shown(input.name()), "')")));
    } else if (typed) {
      ASSIGN_OR_RETURN(views[slot], TypedView(input, dtype, std::move(shape), field));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": no data; send raw_input_contents or contents"));
    }
  }
  if (!views[0]) {
    return absl::InvalidArgumentError("inputs: 'query' is required");
  }
  out.inputs.query = *views[0];
  out.inputs.key = views[1];
  out.inputs.value = views[2];
  out.inputs.key_padding_mask = views[3];
  out.inputs.attn_mask = views[4];
  RETURN_IF_ERROR(DecodeParameters(request, &out));
  for (int i = 0; i < request.outputs_size(); ++i) {
    const std::string& name = request.outputs(i).name();
    for (int j = 0; j < i; ++j) {
      if (request.outputs(j).name() == name) {
        return absl::InvalidArgumentError(
            absl::StrCat("outputs[", i, "].name: '", Shown(name), "' is asked for twice"));
      }
    }
    if (name == "output") {
      out.outputs.push_back(OipOutput::kOutput);
    } else if (name == "attn_weights") {
      out.outputs.push_back(OipOutput::kAttnWeights);
      out.inputs.need_weights = true;  // Asking for the weights implies need_weights.
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs[", i, "].name: expected 'output' or 'attn_weights', got '", Shown(name), "'"));
    }
  }
  if (out.outputs.empty()) {
    out.outputs.push_back(OipOutput::kOutput);
    if (out.inputs.need_weights) out.outputs.push_back(OipOutput::kAttnWeights);
  }
  return out;
}

absl::Status EncodeModelInfer(RequestOutcome& outcome, const std::vector<OipOutput>& outputs,
                              int64_t max_bytes, inference::ModelInferResponse* response) {
  for (OipOutput which : outputs) {
    OutputTensor* t = which == OipOutput::kOutput ? &outcome.output
                      : outcome.attn_weights      ? &*outcome.attn_weights
                                                  : nullptr;
    if (t == nullptr) return absl::InternalError("attn_weights: asked for but not computed");
    auto* meta = response->add_outputs();
    meta->set_name(which == OipOutput::kOutput ? "output" : "attn_weights");
    meta->set_datatype(OipDatatype(t->dtype));
    meta->mutable_shape()->Assign(t->shape.begin(), t->shape.end());
    *response->add_raw_output_contents() = std::move(t->bytes);
  }
  // Where the time went, as attention.v1 reports it.
  auto& parameters = *response->mutable_parameters();
  parameters["queue_us"].set_int64_param(outcome.queue_us);
  parameters["compute_us"].set_int64_param(outcome.compute_us);
  parameters["batch_requests"].set_int64_param(outcome.batch_requests);
  return CheckMessageLimit(response, max_bytes);
}

}  // namespace attention::server
