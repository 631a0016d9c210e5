#include "server/frontends/protocol/oip_model_info.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "server/metrics/model_stats.h"

namespace attention::server {
namespace {

void AddInput(const std::string& name, inference::DataType type, std::vector<int64_t> dims,
              bool optional, inference::ModelConfig* config) {
  inference::ModelInput* input = config->add_input();
  input->set_name(name);
  input->set_data_type(type);
  for (int64_t d : dims) input->add_dims(d);
  input->set_optional(optional);
}

void AddOutput(const std::string& name, std::vector<int64_t> dims, inference::ModelConfig* config) {
  inference::ModelOutput* output = config->add_output();
  output->set_name(name);
  output->set_data_type(inference::TYPE_FP32);
  for (int64_t d : dims) output->add_dims(d);
}

void AddTensor(const std::string& name, const std::string& datatype,
               std::initializer_list<int64_t> shape,
               inference::ModelMetadataResponse::TensorMetadata* t) {
  t->set_name(name);
  t->set_datatype(datatype);
  t->mutable_shape()->Assign(shape.begin(), shape.end());
}

void Set(const ModelStats::Duration& d, inference::StatisticDuration* out) {
  out->set_count(d.count);
  out->set_ns(d.ns);
}

}  // namespace

std::string SequenceAlias(const std::string& model) { return absl::StrCat(model, kSequenceSuffix); }

void DescribeModelMetadata(const ServedModel& model, const std::string& name, bool stateful,
                           inference::ModelMetadataResponse* metadata) {
  const MhaSpec& s = model.model->spec();
  metadata->set_name(name);
  metadata->add_versions("1");
  metadata->set_platform("attention_mha");
  // Inputs also accept FP16 and BF16 (masks: BOOL or FP32); -1: any size.
  // [-1, -1, E] is (N, L, E) or, for a batch_first=False model, (L, N, E)
  // (ModelConfig's parameters["batch_first"] says which); key_padding_mask
  // (N, S) and attn_weights (N, L, S') are the same in both, as in PyTorch.
  AddTensor("query", "FP32", {-1, -1, s.embed_dim}, metadata->add_inputs());
  if (!stateful) {  // A sequence step sends only its query.
    AddTensor("key", "FP32", {-1, -1, s.kdim}, metadata->add_inputs());
    AddTensor("value", "FP32", {-1, -1, s.vdim}, metadata->add_inputs());
    AddTensor("key_padding_mask", "BOOL", {-1, -1}, metadata->add_inputs());
    AddTensor("attn_mask", "BOOL", {-1, -1}, metadata->add_inputs());
  }
  AddTensor("output", "FP32", {-1, -1, s.embed_dim}, metadata->add_outputs());
  AddTensor("attn_weights", "FP32", {-1, -1, -1}, metadata->add_outputs());
}

void DescribeModelConfig(const ServedModel& model, const std::string& name,
                         std::optional<absl::Duration> sequence_idle,
                         inference::ModelConfig* config) {
  const MhaSpec& s = model.model->spec();
  config->set_name(name);
  config->set_platform("attention_mha");
  config->set_backend("attention");
  config->set_max_batch_size(0);  // Each request's shapes carry its batch.
  AddInput("query", inference::TYPE_FP32, {-1, -1, s.embed_dim}, false, config);
  if (sequence_idle) {
    // A sequence step sends only its query; the session holds the rest.
    config->mutable_sequence_batching()->set_max_sequence_idle_microseconds(
        static_cast<uint64_t>(absl::ToInt64Microseconds(*sequence_idle)));
  } else {
    AddInput("key", inference::TYPE_FP32, {-1, -1, s.kdim}, true, config);
    AddInput("value", inference::TYPE_FP32, {-1, -1, s.vdim}, true, config);
    AddInput("key_padding_mask", inference::TYPE_BOOL, {-1, -1}, true, config);
    AddInput("attn_mask", inference::TYPE_BOOL, {-1, -1}, true, config);
    config->mutable_dynamic_batching()->set_max_queue_delay_microseconds(
        static_cast<uint64_t>(model.batcher->options().max_queue_delay_us));
  }
  AddOutput("output", {-1, -1, s.embed_dim}, config);
  AddOutput("attn_weights", {-1, -1, -1}, config);
  config->mutable_model_transaction_policy()->set_decoupled(false);
  (*config->mutable_parameters())["stateful_alias"].set_string_value(
      sequence_idle ? model.name : SequenceAlias(model.name));
  // The dims above hold in both layouts; this says which: "false" for (L, N, E)
  // query and output, (S, N, ·) key and value (a sequence step: [T, 1, E]).
  (*config->mutable_parameters())["batch_first"].set_string_value(
      model.model->serving().batch_first ? "true" : "false");
}

void DescribeModelStatistics(const ServedModel& model, const std::string& name,
                             const std::string& version, inference::ModelStatistics* stats) {
  const ModelStats::Snapshot s = model.metrics->stats->Read();
  stats->set_name(name);
  stats->set_version(version);
  stats->set_last_inference(static_cast<uint64_t>(s.last_inference_ms));
  stats->set_inference_count(s.inference_count);
  stats->set_execution_count(s.execution_count);
  inference::InferStatistics* infer = stats->mutable_inference_stats();
  Set(s.success, infer->mutable_success());
  Set(s.fail, infer->mutable_fail());
  Set(s.queue, infer->mutable_queue());
  Set({s.compute.count, 0}, infer->mutable_compute_input());
  Set(s.compute, infer->mutable_compute_infer());
  Set({s.compute.count, 0}, infer->mutable_compute_output());
  infer->mutable_cache_hit();
  infer->mutable_cache_miss();
  for (const auto& [size, d] : s.batches) {
    inference::InferBatchStatistics* b = stats->add_batch_stats();
    b->set_batch_size(size);
    Set({d.count, 0}, b->mutable_compute_input());
    Set(d, b->mutable_compute_infer());
    Set({d.count, 0}, b->mutable_compute_output());
  }
}

}  // namespace attention::server
