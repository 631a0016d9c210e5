// File: server/frontends/protocol/oip_model_info.h
//
// A served model as Triton's tools read it: its ModelMetadata and
// ModelConfig (inputs with
// their types and dims, -1 where any size goes, key/value/masks optional;
// dynamic batching, or for the stateful alias "<model>_sequence" sequence
// batching) and its ModelStatistics (from the model's ModelStats).
// Stateless functions.
#ifndef ATTENTION_SERVER_FRONTENDS_PROTOCOL_OIP_MODEL_INFO_H_
#define ATTENTION_SERVER_FRONTENDS_PROTOCOL_OIP_MODEL_INFO_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/batching/model_repository.h"

namespace attention::server {

// The name under which `model` is served as a stateful (sequence) model.
inline constexpr absl::string_view kSequenceSuffix = "_sequence";
std::string SequenceAlias(const std::string& model);

// `model`'s metadata under `name` (version "1", platform "attention_mha"):
// the query as the only input for the stateful alias (`stateful`), as its
// ModelConfig says; else query, key, value and the two masks. Tools such as
// perf_analyzer take the tensors to send and the model name to address
// from the metadata, so it must agree with DescribeModelConfig.
void DescribeModelMetadata(const ServedModel& model, const std::string& name, bool stateful,
                           inference::ModelMetadataResponse* metadata);

// `model`'s configuration under `name`: with `sequence_idle` (the alias),
// sequence batching with that idle timeout and the query as the only input;
// else dynamic batching and every input. parameters["batch_first"] is "true"
// or "false" (config.json's: the order of the query's, key's, value's and
// output's first two dims).
void DescribeModelConfig(const ServedModel& model, const std::string& name,
                         std::optional<absl::Duration> sequence_idle,
                         inference::ModelConfig* config);

// `model`'s statistics under `name` and `version`. The compute time is
// reported as compute_infer; compute_input and compute_output have the same
// counts and no time (Triton's clients require the three counts equal).
void DescribeModelStatistics(const ServedModel& model, const std::string& name,
                             const std::string& version, inference::ModelStatistics* stats);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_PROTOCOL_OIP_MODEL_INFO_H_
