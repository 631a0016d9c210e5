// File: client/cli/model_commands.h
//
// attention-client's model subcommands:
//   models            the served models: each one's version, the state of
//                     every known version, its layer and batching settings.
//   repository        the repository index (the Open Inference Protocol's
//                     RepositoryIndex): every model version the server knows,
//                     its state and why it is not READY.
//   load MODEL        (re)loads a model from the repository (LoadModel;
//                     needs --model_control=explicit on the server).
//   unload MODEL      stops serving every version of a model (UnloadModel).
// Each prints to stdout, failures to stderr (CallAdvice's report), and
// returns the process exit code. Functions of a single thread.
#ifndef ATTENTION_CLIENT_CLI_MODEL_COMMANDS_H_
#define ATTENTION_CLIENT_CLI_MODEL_COMMANDS_H_

#include <cstdint>
#include <string>

#include "attention/v1/attention.pb.h"

namespace attention::client {

struct ModelCommandOptions {
  std::string target;
  std::string lb_policy;
  int64_t deadline_ms = 10000;
};

int ListModels(const ModelCommandOptions& options);
int ShowRepository(const ModelCommandOptions& options);
int LoadModel(const ModelCommandOptions& options, const std::string& model);
int UnloadModel(const ModelCommandOptions& options, const std::string& model);

// "2:READY 1:UNAVAILABLE": every version of `model` and its state, newest
// first as the server lists them; "-" when the server names none.
std::string VersionStates(const v1::ModelInfo& model);

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_MODEL_COMMANDS_H_
