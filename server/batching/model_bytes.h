// File: server/batching/model_bytes.h
//
// What a model version costs in resident memory once loaded, known before
// it is loaded: the engine's own figure (MhaEngine::EstimateResidentBytes,
// the packed weights in the compute dtype, without the float model's
// matrices, which the repository's engines drop) from config.json and the
// safetensors header alone. --max_model_bytes and the memory plan's
// baseline count these bytes; after a load the repository counts the
// engine's exact resident_bytes().
//
// Thread-safe: free functions; they read the files and nothing else.
#ifndef ATTENTION_SERVER_BATCHING_MODEL_BYTES_H_
#define ATTENTION_SERVER_BATCHING_MODEL_BYTES_H_

#include <cstdint>
#include <string>

#include "core/mha_engine.h"

namespace attention::server {

// The options the repository makes its engines with.
EngineOptions ServingEngineOptions();

// The bytes of `dir`'s model.safetensors; 0 when it cannot be sized.
int64_t ModelFileBytes(const std::string& dir);

// The resident bytes the model in `dir` will take once loaded (the demo
// model's when `dir` is empty); its file bytes when its spec cannot be read
// (the load will say why).
int64_t EstimateModelBytes(const std::string& dir);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_MODEL_BYTES_H_
