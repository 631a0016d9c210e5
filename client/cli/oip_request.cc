#include "client/cli/oip_request.h"

namespace attention::client {
namespace {

const char* Datatype(v1::DataType dtype) {
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT32:
      return "FP32";
    case v1::DATA_TYPE_BFLOAT16:
      return "BF16";
    case v1::DATA_TYPE_FLOAT16:
      return "FP16";
    case v1::DATA_TYPE_BOOL:
      return "BOOL";
    default:
      return "";
  }
}

void AddInput(const std::string& name, const v1::Tensor& t, inference::ModelInferRequest* r) {
  auto* input = r->add_inputs();
  input->set_name(name);
  input->set_datatype(Datatype(t.dtype()));
  input->mutable_shape()->Assign(t.shape().begin(), t.shape().end());
  r->add_raw_input_contents(t.data());
}

}  // namespace

inference::ModelInferRequest ToModelInfer(const v1::InferRequest& request,
                                          const std::string& model) {
  inference::ModelInferRequest r;
  r.set_model_name(model);
  r.set_id(request.request_id());
  AddInput("query", request.query(), &r);
  if (request.has_key()) AddInput("key", request.key(), &r);
  if (request.has_value()) AddInput("value", request.value(), &r);
  if (request.has_key_padding_mask()) {
    AddInput("key_padding_mask", request.key_padding_mask(), &r);
  }
  if (request.has_attn_mask()) AddInput("attn_mask", request.attn_mask(), &r);
  auto& parameters = *r.mutable_parameters();
  if (request.is_causal()) parameters["is_causal"].set_bool_param(true);
  if (request.need_weights()) parameters["need_weights"].set_bool_param(true);
  if (request.per_head_weights()) parameters["average_attn_weights"].set_bool_param(false);
  return r;
}

int64_t OipInt(const inference::ModelInferResponse& response, const std::string& name) {
  const auto it = response.parameters().find(name);
  if (it == response.parameters().end()) return 0;
  return it->second.int64_param();
}

}  // namespace attention::client
