// attention-server: serves torch.nn.MultiheadAttention layers over gRPC.
//
//   attention-server                                  # the built-in demo model
//   attention-server --model_repository=/models --port=50051 --metrics_port=9464
//
// Start-up: listen (health NOT_SERVING), load and warm up every model, then
// report SERVING. SIGTERM or SIGINT: report NOT_SERVING, refuse new work
// with UNAVAILABLE, finish every accepted request (up to --drain_timeout_s),
// exit 0. During the start-up load the signal abandons the load and the
// server exits 0 at once (a stop that was asked for is not a failure).
//
// Test hook (server_process_test): ATTENTION_TEST_LOAD_DELAY_MS=<ms>[:<model>] makes every
// load (of <model>) wait <ms> before reading its files, stopping early when abandoned.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/workspace.h"
#include "server/accept_guard.h"
#include "server/allocator_trimmer.h"
#include "server/attention_server.h"
#include "server/memory_limit.h"
#include "server/memory_plan.h"
#include "server/port_probe.h"
#include "server/security/grpc_log.h"
#include "server/server_flags.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on for gRPC and metrics.");
ABSL_FLAG(int, port, 50051, "gRPC port (0: pick a free one and print it).");
ABSL_FLAG(int, metrics_port, 9464, "Prometheus /metrics port; 0 turns metrics serving off.");
ABSL_FLAG(std::string, model_repository, "",
          "Folder of model directories (config.json + model.safetensors each, named by "
          "folder); empty: the built-in demo model 'demo'.");
ABSL_FLAG(std::string, default_model, "",
          "Model an empty InferRequest.model selects; empty: the first by name.");
ABSL_FLAG(int, threads, 0, "Compute threads (oneDNN/OpenMP), 0 to 4096; 0: every core.");
ABSL_FLAG(int64_t, max_batch_size, 16,
          "Default requests per executed batch (a model's config.json overrides); 1 turns "
          "batching off.");
ABSL_FLAG(int64_t, max_batch_tokens, 16384, "Default padded query tokens per executed batch.");
ABSL_FLAG(int64_t, max_queue_delay_us, 0,
          "Default longest wait of the oldest queued request for company, in microseconds "
          "(0: batch only what queued up while the previous batch computed).");
ABSL_FLAG(int64_t, max_queue_size, 1024,
          "Queued requests per model before RESOURCE_EXHAUSTED (with tokens, shared by weight).");
ABSL_FLAG(int, http_port, 8000,
          "KServe v2 REST port (HTTP/JSON, Triton's binary tensor extension), with the gRPC "
          "port's TLS and tokens; 0 turns REST off.");
ABSL_FLAG(int, http_io_threads, 2,
          "REST I/O threads: every REST connection's reads and writes, none waiting on a "
          "client (inference runs on the batchers).");
ABSL_FLAG(int, http_max_connections, 1024,
          "REST connections open at once; one more is answered 503 and closed.");
ABSL_FLAG(int, http_threads, 0,
          "Deprecated alias of --http_io_threads (REST no longer has a thread per "
          "connection): when set, its value, at most twice the cores, is the I/O threads.");
ABSL_FLAG(int, max_message_bytes, 64 << 20,
          "Largest request or response message, in bytes (clients have their own limit: "
          "attention-client --max_message_bytes, 256 MiB by default).");
ABSL_FLAG(int, infer_parse_threads, 1,
          "Threads (1 to 64, at nice +5) parsing attention.v1 Infer requests over 256 KiB; "
          "another value is refused.");
ABSL_FLAG(int64_t, max_stream_pending, 64,
          "Per stream (InferStream, SessionStream, ModelStreamInfer): requests read but not yet "
          "answered and written before the stream stops reading (back-pressure on a client that "
          "does not read its responses).");
ABSL_FLAG(int64_t, max_stream_pending_bytes, int64_t{256} << 20,
          "Per stream (InferStream, SessionStream, ModelStreamInfer): bytes of those requests and "
          "their responses before the stream stops reading.");
ABSL_FLAG(double, max_connection_age_s, 60,
          "Connections are closed gracefully (GOAWAY) after this many seconds so that clients "
          "open new calls on a new connection, re-resolving the service name and reaching new "
          "replicas; 0: never.");
ABSL_FLAG(double, max_connection_age_grace_s, std::numeric_limits<double>::infinity(),
          "How long calls already open on a connection past its age (streams in use, long "
          "calls) may still run before the connection is closed under them; inf (the "
          "default): to their end (--drain_timeout_s bounds them at shutdown).");
ABSL_FLAG(int, drain_timeout_s, 30,
          "On SIGTERM/SIGINT, how long accepted requests and a model load in progress may take "
          "to finish (the load is then abandoned).");
ABSL_FLAG(int64_t, session_memory_bytes, 0,
          "Budget of every session's key/value cache, in bytes; 0: its share of the memory "
          "plan (15% of what the process's baseline leaves of 85% of the memory limit).");
ABSL_FLAG(int64_t, max_sessions, 4096,
          "Default live sessions per model (config.json's max_sessions overrides); 0: none.");
ABSL_FLAG(int64_t, max_session_tokens, 32768,
          "Default tokens one session may hold (config.json's max_session_tokens overrides).");
ABSL_FLAG(int64_t, session_ttl_s, 600,
          "Default idle seconds before a session expires (config.json's session_ttl_s and "
          "CreateSession's ttl_s override).");
ABSL_FLAG(int64_t, max_session_ttl_s, 86400,
          "Longest ttl_s a CreateSession may ask for; longer is refused with INVALID_ARGUMENT "
          "(not clamped). --session_ttl_s may not exceed it.");
ABSL_FLAG(int64_t, max_sessions_per_tenant, 0,
          "Live sessions of one model one caller (token) may hold; a new one past it may evict "
          "only that caller's own idle sessions. 0: a quarter of the model's max_sessions with "
          "--auth_tokens_file, the model's max_sessions without (every caller is then one "
          "tenant).");
ABSL_FLAG(int64_t, session_memory_per_tenant_bytes, 0,
          "Session cache bytes one caller (token) may hold, all models together; past it its "
          "appends may evict only its own idle sessions. 0: a quarter of --session_memory_bytes "
          "with --auth_tokens_file, all of it without.");
ABSL_FLAG(double, session_evict_grace_s, 2,
          "Only sessions idle at least this long may be evicted to make room for others.");
ABSL_FLAG(std::string, advertise_address, "",
          "This replica's address as clients reach it (host:port); appended to session ids so "
          "that clients send a session's calls to the replica holding it.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain of the gRPC port; with --tls_key_file turns TLS on (the files "
          "are re-read when they change). Empty: plaintext.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA bundle; set: mutual TLS, every client must present a certificate it signed.");
ABSL_FLAG(int, tls_reload_interval_s, 10,
          "How often the TLS files are checked for a new certificate, key or CA.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "File of bearer tokens as SHA-256 hashes with the models each may call "
          "('<sha256 hex> <name> <model,model|*>' per line), re-read when it changes. Empty: no "
          "authentication.");
ABSL_FLAG(bool, auth_probes, false,
          "With --auth_tokens_file: health checks need a token too, and so does reflection. "
          "Default: health and reflection stay open for Kubernetes probes and tools.");
ABSL_FLAG(int64_t, max_inflight_bytes, 0,
          "Bytes of requests accepted and not yet answered, with the outputs and weights they "
          "will produce; past it requests get RESOURCE_EXHAUSTED. 0: its share of the memory "
          "plan (17% of what the process's baseline leaves of 85% of the memory limit).");
ABSL_FLAG(int64_t, max_batch_working_bytes, 0,
          "Working memory of the one batch computing (padded inputs, attention weights, "
          "projections, workspaces), held beside --max_inflight_bytes; requests join a batch "
          "only while it stays under it, and one over it alone gets RESOURCE_EXHAUSTED. 0: half "
          "of --max_inflight_bytes, at most 512 MiB.");
ABSL_FLAG(int64_t, grpc_receive_quota_bytes, 0,
          "gRPC's resource quota for buffers of messages being received, before the service "
          "can refuse them; near it gRPC refuses new calls and then cancels calls (RST_STREAM "
          "\"Buffers full\"). 0: its share of the memory plan.");
ABSL_FLAG(int64_t, memory_limit_bytes, 0,
          "The memory every budget is planned from (logged as a table at start); 0: the cgroup "
          "memory limit (v2 memory.max or v1 memory.limit_in_bytes), or the machine's memory "
          "when there is none. The server refuses to start when --max_inflight_bytes, "
          "--grpc_receive_quota_bytes and --session_memory_bytes with its own baseline exceed "
          "it.");
ABSL_FLAG(std::string, model_control, "none",
          "How models change while serving: none (loaded once at start), poll (re-read "
          "--model_repository every --repository_poll_s: new versions load, removed ones "
          "unload), explicit (only LoadModel/UnloadModel and Triton's RepositoryModelLoad/"
          "Unload, for --admin_tokens_file's callers).");
ABSL_FLAG(double, repository_poll_s, 15, "--model_control=poll: seconds between scans.");
ABSL_FLAG(std::string, admin_tokens_file, "",
          "Tokens (the --auth_tokens_file format; the models column names what each may load "
          "and unload) allowed to load and unload models. Each must also be in "
          "--auth_tokens_file (every call authenticates there first). Without it, only a server "
          "without --auth_tokens_file lets callers do so.");
ABSL_FLAG(int64_t, max_model_bytes, 0,
          "Resident bytes of every resident version's prepared weights (float32: about its "
          "model.safetensors size, bfloat16 half, int8 a quarter), at most; a load past it is "
          "refused and the serving versions go on. 0: no limit.");
ABSL_FLAG(bool, warmup, true, "Create oneDNN primitives for common shapes before serving.");

namespace attention::server {
namespace {

// The ATTENTION_TEST_LOAD_DELAY_MS hook (see the top of this file), or none.
std::function<absl::Status(const std::string&, int64_t, const std::function<bool()>&)>
SlowLoadHookForTesting() {
  const char* value = std::getenv("ATTENTION_TEST_LOAD_DELAY_MS");
  if (value == nullptr) return nullptr;
  const std::vector<std::string> parts = absl::StrSplit(value, absl::MaxSplits(':', 1));
  int64_t ms = 0;
  if (!absl::SimpleAtoi(parts[0], &ms) || ms <= 0) return nullptr;
  const std::string only = parts.size() > 1 ? parts[1] : "";
  std::cerr << "test hook: ATTENTION_TEST_LOAD_DELAY_MS=" << value << "\n";
  return [ms, only](const std::string& model, int64_t version,
                    const std::function<bool()>& abandoned) {
    if (!only.empty() && model != only) return absl::OkStatus();
    std::cerr << "test hook: slowing the load of model '" << model << "' version " << version
              << " by " << ms << " ms\n";
    const absl::Time until = absl::Now() + absl::Milliseconds(ms);
    while (absl::Now() < until) {
      if (abandoned()) return absl::CancelledError("test hook: abandoned");
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::OkStatus();
  };
}

const char* SignalName(int signal_number) {
  return signal_number == SIGTERM ? "SIGTERM" : "SIGINT";
}

int Run() {
  // Block the stop signals in every thread; this one waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (const absl::Status ranges = CheckFlagRanges(); !ranges.ok()) {
    std::cerr << ranges.message() << "\n";
    return 2;
  }
  ServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.http_port = absl::GetFlag(FLAGS_http_port) > 0 ? absl::GetFlag(FLAGS_http_port) : -1;
  options.http_io_threads = absl::GetFlag(FLAGS_http_io_threads);
  if (const int legacy = absl::GetFlag(FLAGS_http_threads); legacy > 0) {
    options.http_io_threads =
        std::min(legacy, 2 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  }
  options.http_max_connections = absl::GetFlag(FLAGS_http_max_connections);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.infer_parse_threads = absl::GetFlag(FLAGS_infer_parse_threads);
  options.max_stream_pending = absl::GetFlag(FLAGS_max_stream_pending);
  options.max_stream_pending_bytes = absl::GetFlag(FLAGS_max_stream_pending_bytes);
  options.drain_timeout = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  options.max_connection_age = absl::Seconds(absl::GetFlag(FLAGS_max_connection_age_s));
  options.connection_age_grace = absl::Seconds(absl::GetFlag(FLAGS_max_connection_age_grace_s));
  for (const auto& [flag, value] :
       {std::pair{"max_connection_age_s", absl::GetFlag(FLAGS_max_connection_age_s)},
        std::pair{"max_connection_age_grace_s", absl::GetFlag(FLAGS_max_connection_age_grace_s)}}) {
    if (!(value >= 0)) {
      std::cerr << "--" << flag << ": expected a number of seconds >= 0 (or inf), got " << value
                << "\n";
      return 2;
    }
  }
  RepositoryOptions& repo = options.repository;
  repo.path = absl::GetFlag(FLAGS_model_repository);
  repo.default_model = absl::GetFlag(FLAGS_default_model);
  repo.batching.max_batch_size = absl::GetFlag(FLAGS_max_batch_size);
  repo.batching.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  repo.batching.max_queue_delay_us = absl::GetFlag(FLAGS_max_queue_delay_us);
  repo.batching.max_queue_size = absl::GetFlag(FLAGS_max_queue_size);
  repo.compute_threads = absl::GetFlag(FLAGS_threads) > 0
                             ? absl::GetFlag(FLAGS_threads)
                             : static_cast<int>(std::thread::hardware_concurrency());
  repo.warmup = absl::GetFlag(FLAGS_warmup);
  absl::StatusOr<ModelControl> control = ParseModelControl(absl::GetFlag(FLAGS_model_control));
  if (!control.ok()) {
    std::cerr << control.status().message() << "\n";
    return 2;
  }
  repo.control = *control;
  if (absl::GetFlag(FLAGS_repository_poll_s) <= 0) {
    std::cerr << "--repository_poll_s: expected a positive number of seconds, got "
              << absl::GetFlag(FLAGS_repository_poll_s) << "\n";
    return 2;
  }
  repo.poll_interval = absl::Seconds(absl::GetFlag(FLAGS_repository_poll_s));
  repo.max_model_bytes = absl::GetFlag(FLAGS_max_model_bytes);
  repo.load_hook = SlowLoadHookForTesting();
  repo.exit_on_error = ExitOnErrorFlag();
  // A busy port is one line, before the plan's table or anything else.
  for (const auto& [port, flag] :
       {std::pair{options.port, "port"}, std::pair{options.metrics_port, "metrics_port"},
        std::pair{options.http_port, "http_port"}}) {
    if (port < 0 && std::string_view(flag) != "port") continue;  // Metrics or REST off.
    if (const absl::Status free = CheckPortFree(options.host, port, flag); !free.ok()) {
      std::cerr << free.message() << "\n";
      return 1;
    }
  }
  // Before gRPC listens: its listener must never see accept4() fail.
  std::cerr << InstallAcceptGuard() << "\n";
  // Every memory budget from one plan (see MemoryPlan), logged as a table.
  MemoryPlanInputs plan_inputs;
  if (absl::GetFlag(FLAGS_memory_limit_bytes) > 0) {
    plan_inputs.limit_bytes = absl::GetFlag(FLAGS_memory_limit_bytes);
    plan_inputs.limit_source = "--memory_limit_bytes";
  } else {
    plan_inputs.limit_bytes = MemoryLimitBytes(&plan_inputs.limit_source);
  }
  const int64_t resident_at_start = ResidentBytes();
  plan_inputs.baseline_bytes =
      MemoryPlan::EstimateBaseline(resident_at_start, repo.path, &plan_inputs.baseline_source);
  plan_inputs.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  plan_inputs.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  plan_inputs.max_batch_working_bytes = absl::GetFlag(FLAGS_max_batch_working_bytes);
  plan_inputs.grpc_receive_quota_bytes = absl::GetFlag(FLAGS_grpc_receive_quota_bytes);
  plan_inputs.session_memory_bytes = absl::GetFlag(FLAGS_session_memory_bytes);
  const absl::StatusOr<MemoryPlan> plan = MemoryPlan::Make(plan_inputs);
  if (!plan.ok()) {
    std::cerr << plan.status().message() << "\n";
    return 1;
  }
  std::cerr << plan->Table();
  options.max_inflight_bytes = plan->max_inflight_bytes();
  options.grpc_receive_quota_bytes = plan->grpc_receive_quota_bytes();
  repo.batching.max_batch_weights_bytes = plan->max_batch_weights_bytes();
  options.max_batch_working_bytes = plan->max_batch_weights_bytes();
  Workspace::SetKeptLimit(static_cast<size_t>(plan->workspace_kept_bytes()));
  SessionOptions& sessions = options.sessions;
  sessions.memory_bytes = plan->session_memory_bytes();
  sessions.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  sessions.max_session_tokens = absl::GetFlag(FLAGS_max_session_tokens);
  sessions.ttl = absl::Seconds(absl::GetFlag(FLAGS_session_ttl_s));
  sessions.evict_grace = absl::Seconds(absl::GetFlag(FLAGS_session_evict_grace_s));
  sessions.max_ttl = absl::Seconds(absl::GetFlag(FLAGS_max_session_ttl_s));
  sessions.max_sessions_per_tenant = absl::GetFlag(FLAGS_max_sessions_per_tenant);
  sessions.memory_per_tenant_bytes = absl::GetFlag(FLAGS_session_memory_per_tenant_bytes);
  if (absl::GetFlag(FLAGS_session_ttl_s) > absl::GetFlag(FLAGS_max_session_ttl_s)) {
    std::cerr << "--session_ttl_s " << absl::GetFlag(FLAGS_session_ttl_s)
              << " exceeds --max_session_ttl_s " << absl::GetFlag(FLAGS_max_session_ttl_s) << "\n";
    return 1;
  }
  sessions.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  options.tls.reload_interval_s = absl::GetFlag(FLAGS_tls_reload_interval_s);
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.admin_tokens_file = absl::GetFlag(FLAGS_admin_tokens_file);
  options.auth_probes = absl::GetFlag(FLAGS_auth_probes);

  auto server = AttentionServer::Listen(options);
  if (!server.ok()) {
    std::cerr << server.status().message() << "\n";
    return 1;
  }
  // A thread of its own takes the stop signals from here on, so that one
  // during the start-up load abandons the load instead of waiting for it.
  std::atomic<int> signal_number{0};
  std::atomic<bool> loading{true};
  std::atomic<bool> quiet{false};  // Woken to end, not by a signal.
  absl::Notification stop;
  std::thread signals([&, s = server->get()] {
    int number = 0;
    sigwait(&stop_signals, &number);
    if (quiet.load()) return;
    signal_number.store(number);
    if (loading.load()) {
      std::cerr << "received " << SignalName(number)
                << " while loading models: the load is abandoned\n";
      s->AbandonLoads();
    }
    stop.Notify();
  });
  auto end_signals = [&] {
    if (!stop.HasBeenNotified()) {
      quiet.store(true);
      pthread_kill(signals.native_handle(), SIGTERM);
    }
    signals.join();
  };
  const absl::Status loaded = (*server)->LoadModels();
  loading.store(false);
  if (!loaded.ok()) {
    const bool stopped = signal_number.load() != 0;
    end_signals();
    if (stopped) {
      std::cerr << "stopped before serving (" << SignalName(signal_number.load())
                << " during the start-up load)\n";
      return 0;
    }
    std::cerr << "cannot load models: " << loaded.message() << "\n";
    return 1;
  }
  // What malloc keeps freed stays within the plan's allocator reserve.
  AllocatorTrimmer::Options trim;
  trim.reserve_bytes = plan->allocator_reserve_bytes();
  trim.unmanaged_bytes = resident_at_start;
  trim.mapped_elsewhere = [metrics = &(*server)->metrics()] {
    return static_cast<int64_t>(metrics->session_memory_bytes().Value());
  };
  AllocatorTrimmer trimmer(std::move(trim));
  const int64_t resident = ResidentBytes();
  std::cerr << "memory plan: resident " << resident << " bytes once ready (baseline planned "
            << plan->baseline_bytes() << ")"
            << (resident > plan->baseline_bytes() ? ": over the plan's baseline" : "") << "\n";
  stop.WaitForNotification();
  signals.join();
  std::cerr << "received " << SignalName(signal_number.load()) << ": draining (up to "
            << absl::GetFlag(FLAGS_drain_timeout_s) << " s)\n";
  const bool drained = (*server)->Drain();
  std::cerr << "stopped" << (drained ? "" : " (drain timed out)") << "; peak resident "
            << PeakResidentBytes() << " bytes, " << trimmer.trims() << " allocator trim(s)\n";
  return 0;
}

}  // namespace
}  // namespace attention::server

int main(int argc, char** argv) {
  attention::server::ConfigureUsage();
  // glibc returns freed blocks above its mmap threshold to the OS, and the
  // next call's buffers of the same size fault in again, a page at a time
  // (expensive on these VMs). Serve up to 32 MiB from the heap and keep up
  // to 256 MiB of freed memory there for reuse, in one arena, so that the
  // AllocatorTrimmer can return what exceeds the plan's reserve (see
  // ConfigureAllocator). Before any thread starts.
  attention::server::ConfigureAllocator();
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles
  // (GraphCycles::GetId was ~3% of the server's CPU under load): off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  attention::server::ParseServerFlags(argc, argv);
  attention::server::RouteGrpcLog();  // Handshake failures as one throttled line of ours.
  return attention::server::Run();
}
