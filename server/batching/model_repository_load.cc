// ModelRepository::LoadVersion: one version from its folder to ready to
// serve (the rest of the class is in model_repository.cc).
#include <malloc.h>
#include <omp.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "server/batching/model_bytes.h"
#include "server/batching/model_repository.h"
#include "server/batching/version_reaper.h"
#include "server/batching/warmup.h"

namespace attention::server {
namespace {

BatchingOptions Resolve(BatchingOptions b, const ServingConfig& c) {
  if (c.max_batch_size) b.max_batch_size = *c.max_batch_size;
  if (c.max_batch_tokens) b.max_batch_tokens = *c.max_batch_tokens;
  if (c.max_queue_delay_us) b.max_queue_delay_us = *c.max_queue_delay_us;
  if (c.max_queue_size) b.max_queue_size = *c.max_queue_size;
  return b;
}

// Runs `work` on a thread of its own at a lower CPU priority (nice +10,
// best effort), and waits for it: a version loading beside serving takes the
// cores that serving leaves, rather than half of them. The threads it starts
// (OpenMP's, for the warm-up) inherit the priority; the batcher's thread,
// started later from the caller's, does not (an unprivileged process could
// not raise it back).
absl::Status InBackground(const std::function<absl::Status()>& work) {
  absl::Status status;
  std::thread thread([&] {
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
    status = work();
  });
  thread.join();
  return status;
}

}  // namespace

absl::StatusOr<std::shared_ptr<ServedModel>> ModelRepository::LoadVersion(const std::string& name,
                                                                          int64_t version,
                                                                          const std::string& dir,
                                                                          bool* no_room) {
  const absl::Time start = absl::Now();
  auto fail = [&](const absl::Status& status, const char* result) {
    if (abandoned()) {  // Not a verdict on the version: not counted.
      std::cerr << "model '" << name << "' version " << version
                << ": load abandoned: the server is shutting down\n";
      return absl::UnavailableError(absl::StrCat("model '", name, "' version ", version,
                                                 ": load abandoned: the server is shutting down"));
    }
    load_metrics_.Load(name, version, result, 0);
    std::cerr << "model '" << name << "' version " << version
              << ": not loaded: " << status.message() << "\n";
    return status;
  };
  if (abandoned()) return fail(absl::CancelledError("abandoned"), "failure");
  const std::function<bool()> stop = [this] { return abandoned(); };
  // Admitted by the engine's estimate of its resident bytes (model_bytes.h);
  // the exact figure replaces it once the engine is made.
  const int64_t bytes = EstimateModelBytes(dir);
  const int64_t file_bytes = dir.empty() ? 0 : ModelFileBytes(dir);
  {
    absl::MutexLock lock(&mu_);
    if (options_.max_model_bytes > 0 && resident_bytes_ + bytes > options_.max_model_bytes) {
      if (no_room != nullptr) *no_room = true;
      return fail(absl::ResourceExhaustedError(
                      absl::StrCat("model '", name, "' version ", version, ": its ", bytes,
                                   " resident bytes of weights do not fit beside the ",
                                   resident_bytes_, " resident (--max_model_bytes ",
                                   options_.max_model_bytes, "); unload a version first")),
                  "refused");
    }
    resident_bytes_ += bytes;
  }
  // Counted from here on: the deleter (through the reaper) gives the bytes back.
  auto* raw = new ServedModel();
  raw->name = name;
  raw->version = version;
  raw->bytes = bytes;
  reaper_->Own();
  std::shared_ptr<ServedModel> served(
      raw, [reaper = reaper_](ServedModel* m) { reaper->Retire(m, m->bytes, [m] { delete m; }); });
  absl::Time read, prepared;
  // Abandoned (a drain's deadline, a stop signal) between chunks of
  // reading, before the engine and between warm-up passes.
  const absl::Status made = InBackground([&]() -> absl::Status {
    if (options_.load_hook) {
      const absl::Status hooked = options_.load_hook(name, version, stop);
      if (!hooked.ok()) return hooked;
    }
    absl::StatusOr<std::shared_ptr<const MhaModel>> model =
        dir.empty() ? absl::StatusOr<std::shared_ptr<const MhaModel>>(MhaModel::Demo())
                    : MhaModel::LoadFromDirectory(dir, stop);
    if (!model.ok()) return model.status();
    read = absl::Now();
    if (stop()) return absl::CancelledError("abandoned");
    // The engine packs the weights and keeps the model without its
    // matrices: the version holds its weights once (this is the last
    // pointer to the loaded model).
    absl::StatusOr<std::unique_ptr<MhaEngine>> engine =
        MhaEngine::Create(*std::move(model), ServingEngineOptions());
    if (!engine.ok()) return engine.status();
    served->engine = *std::move(engine);
    served->model = served->engine->shared_model();
    {
      const int64_t resident = served->engine->resident_bytes();
      absl::MutexLock lock(&mu_);
      resident_bytes_ += resident - raw->bytes;
      raw->bytes = resident;
    }
    prepared = absl::Now();
    if (!options_.warmup) return absl::OkStatus();
    // Batches run with one thread or all of them (see DynamicBatcher):
    // primitives are made per thread count.
    for (int threads : {1, options_.compute_threads}) {
      omp_set_num_threads(threads);
      const absl::Status warm = WarmUp(*served->engine, stop);
      if (!warm.ok() && stop()) return warm;
      if (!warm.ok()) {
        return absl::InternalError(absl::StrCat(name, ": warm-up: ", warm.message()));
      }
    }
    return absl::OkStatus();
  });
  // The load's transient copies (the file's tensors, the split of
  // in_proj_weight) and the warm-up's buffers lie freed in the heap, below
  // the 256 MiB trim threshold (ConfigureAllocator): give them back now
  // rather than at the allocator trimmer's next look.
  malloc_trim(0);
  if (!made.ok() || abandoned()) return fail(made, "failure");
  const absl::Time warm = absl::Now();
  served->metrics = metrics_->AddModel(name);
  absl::StatusOr<std::unique_ptr<DynamicBatcher>> batcher = DynamicBatcher::Create(
      served->engine.get(), Resolve(options_.batching, served->model->serving()), served->metrics,
      &compute_mutex_, options_.compute_threads);
  if (!batcher.ok()) return fail(batcher.status(), "failure");
  served->batcher = *std::move(batcher);
  if (options_.on_load) options_.on_load(*served);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  load_metrics_.Load(name, version, "success", seconds);
  const MhaSpec& s = served->model->spec();
  const BatchingOptions& b = served->batcher->options();
  std::cerr << "model '" << name << "' version " << version << ": embed_dim " << s.embed_dim
            << ", num_heads " << s.num_heads << ", kdim " << s.kdim << ", vdim " << s.vdim
            << ", compute " << DTypeName(s.compute_dtype)
            << (served->engine->has_fused_qkv() ? "" : " (q, k, v unfused)")
            << "; weights resident " << absl::StrFormat("%.1f", served->bytes / 1048576.0) << " MiB"
            << (file_bytes > 0 ? absl::StrFormat(" (%.2fx the file's %.1f MiB)",
                                                 static_cast<double>(served->bytes) / file_bytes,
                                                 file_bytes / 1048576.0)
                               : std::string())
            << "; batching max_batch_size " << b.max_batch_size << ", max_batch_tokens "
            << b.max_batch_tokens << ", max_queue_delay_us " << b.max_queue_delay_us
            << ", max_queue_size " << b.max_queue_size << (options_.warmup ? "; warmed up" : "")
            << " in " << seconds << " s (read " << absl::ToDoubleSeconds(read - start)
            << " s, engine " << absl::ToDoubleSeconds(prepared - read) << " s, warm-up "
            << absl::ToDoubleSeconds(warm - prepared) << " s)\n";
  return served;
}

}  // namespace attention::server
