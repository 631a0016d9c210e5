// Sessions at the core level (no gRPC): a small model derived from the input
// (embed_dim, heads, kdim/vdim equal to or different from E, bias,
// add_bias_kv, add_zero_attn, float32 or bfloat16 compute), up to three
// sessions of it (self, or cross with or without is_causal and a
// key_padding_mask), a cache dtype, and rounds of appends: each round is one
// SessionEngine::Run over a step of several sessions (pipelined, as the
// server batches them), committed by Run, by the caller, or dropped.
//
// Checked: ValidateStep and ValidateCross accept exactly the valid steps and
// keys (a self session needs kdim == vdim == embed_dim); every row of every
// step equals the stateless MhaEngine::Forward row over the whole sequence so
// far (self: causal, key_padding_mask = not_key; cross: the same keys), and
// so do its weights (averaged or per head); a step is part of its session if
// and only if it was committed; a refused or failed step changes nothing;
// every cache block goes back to the pool; and each Run and InitCross
// allocates (MemoryMeter) no more than its working-memory estimate
// (StepWorkingBytes summed over the batch, CrossWorkingBytes).
//
// Tolerance, per row, |session - stateless| <= tol * (1 + max |stateless
// row|) (norm-wise, so that a small element that is the difference of large
// terms is held to the terms' scale, not its own):
// - float32 compute and cache: tol 1e-4. Both paths compute the same float32
//   projections and softmax; they differ in summation order (GEMM blocking,
//   per-row kernels vs batched matmuls) and exp implementation: a few ulp
//   (6e-8) times sqrt(terms) (E <= 256, S <= 48), about 1e-6.
// - bfloat16 compute or cache: tol 4e-2. Each path rounds different
//   intermediates to bfloat16 (unit roundoff u = 2^-8 = 3.9e-3): the cache
//   rounds keys and values, the stateless path its matmul operands and
//   probabilities. A score q.k/sqrt(d) (|score| up to ~8 here: inputs in
//   [-4, 4), Xavier-scaled weights) moves by up to ~2u|score| = 0.06 at
//   worst, a probability by as much relatively, and the rounded values add
//   u: a few u on typical rows, ~10u on the worst.
// Measured over 82,583 inputs (two 4-minute libFuzzer runs, one from the
// seeds, one from nothing with inputs up to 1500 bytes): worst
// row float32 8.9e-7 (margin 110), bfloat16 9.7e-3 (margin 4). A key too
// many or too few moves a row by about 1/keys of its value spread: caught
// in float32 for every length here, in bfloat16 for short sequences.
#include <omp.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/kv_block_pool.h"
#include "core/memory_budget.h"
#include "core/memory_meter.h"
#include "core/mha_engine.h"
#include "core/session_engine.h"
#include "core/status_macros.h"
#include "tests/fuzz/fuzz_entries.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/session_oracle.h"

namespace attention::fuzz {
namespace {

constexpr size_t kMaxSessions = 3;
constexpr int64_t kMaxTokens = 48;  // Per session: self tokens or cross queries.
constexpr int64_t kMaxChunk = 12;
constexpr int kMaxRounds = 10;
constexpr int64_t kMaxCrossKeys = 20;
// Sometimes a large cross session: keys and chunks whose weights take more
// than the estimates' fixed allowances (oneDNN's 4 MiB scratchpad each), so
// that allocated <= estimated is tested where an uncounted buffer shows.
constexpr int64_t kMinLargeKeys = 2048, kMaxLargeKeys = 16384;
constexpr int64_t kMaxLargeChunk = 64, kMaxLargeTokens = 128;
// Values beyond this many in one tensor follow a fixed pattern instead of
// taking the input's bytes (which the later decisions need).
constexpr int64_t kMaxReadValues = 512;
constexpr size_t kMaxEngines = 128;

absl::Status Bug(absl::string_view what) {
  return absl::InternalError(absl::StrCat("fuzz invariant: ", what));
}

// Runs `call` and checks that what it allocated (MemoryMeter: workspaces and
// tensors) stays within `estimate` (issue 21 item 3: allocated <= admitted).
// The call's own verdict is returned when it holds.
absl::Status Metered(int64_t estimate, absl::string_view what,
                     const std::function<absl::Status()>& call) {
  const int64_t before = MemoryMeter::current();
  MemoryMeter::ResetPeak();
  const absl::Status status = call();
  const int64_t allocated = MemoryMeter::peak() - before;
  if (allocated > estimate) {
    return Bug(absl::StrCat(what, " allocated ", allocated, " bytes, over its working estimate ",
                            estimate, " (", status.ToString(), ")"));
  }
  return status;
}

// Engines by spec and seed, kept across inputs (creating one prepares the
// weights and its oneDNN primitives), at most kMaxEngines.
absl::StatusOr<const MhaEngine*> EngineFor(const MhaSpec& s, uint64_t seed) {
  static auto* const engines = new std::map<std::string, std::unique_ptr<MhaEngine>>;
  const std::string key =
      absl::StrCat(s.embed_dim, "/", s.num_heads, "/", s.kdim, "/", s.vdim, "/", s.bias,
                   s.add_bias_kv, s.add_zero_attn, "/", DTypeName(s.compute_dtype), "/", seed);
  auto it = engines->find(key);
  if (it != engines->end()) return it->second.get();
  if (engines->size() >= kMaxEngines) engines->clear();
  ASSIGN_OR_RETURN(std::shared_ptr<const MhaModel> model, MhaModel::Random(s, seed));
  ASSIGN_OR_RETURN(std::unique_ptr<MhaEngine> engine, MhaEngine::Create(std::move(model)));
  const MhaEngine* made = engine.get();
  (*engines)[key] = std::move(engine);
  return made;
}

MhaSpec ReadSpec(FuzzInput& in, uint64_t* seed) {
  MhaSpec s;
  s.num_heads = in.Range(1, 4);
  s.embed_dim = s.num_heads * in.Range(1, 8);
  // Mostly kdim == vdim == E (what self sessions need); else 1..24.
  s.kdim = in.Percent(75) ? s.embed_dim : in.Range(1, 24);
  s.vdim = in.Percent(75) ? s.embed_dim : in.Range(1, 24);
  const uint8_t flags = in.Byte();
  s.bias = (flags & 1) == 0;
  s.add_bias_kv = (flags & 2) != 0;
  s.add_zero_attn = (flags & 4) != 0;
  s.compute_dtype = (flags & 8) != 0 ? DType::kBFloat16 : DType::kFloat32;
  *seed = (flags >> 4) & 3;
  if ((flags & 64) != 0) {
    // Head dims of 16 to 64, which the AVX-512 decode kernel takes
    // (session_decode.h; the dims above, 1 to 8, never reach it).
    const int64_t wide = s.num_heads * 16 * in.Range(1, 4);
    if (s.kdim == s.embed_dim) s.kdim = wide;
    if (s.vdim == s.embed_dim) s.vdim = wide;
    s.embed_dim = wide;
  }
  return s;
}

DType ReadFloatDType(FuzzInput& in) {
  const uint8_t b = in.Byte() % 4;
  return b == 1 ? DType::kBFloat16 : b == 2 ? DType::kFloat16 : DType::kFloat32;
}

// A tensor of `dtype` holding `values` (exact in every float dtype).
Tensor MakeTensor(DType dtype, Shape shape, const std::vector<float>& values) {
  Tensor t(dtype, std::move(shape));
  if (!values.empty()) {
    ConvertFloats(DType::kFloat32, values.data(), dtype, t.data(),
                  static_cast<size_t>(t.num_elements()));
  }
  return t;
}

std::vector<float> ReadValues(FuzzInput& in, int64_t count) {
  std::vector<float> v(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<int64_t>(i) < kMaxReadValues
               ? in.Value()
               : 0.25f * static_cast<float>(i * 7 % 11) - 1.25f;
  }
  return v;
}

struct FuzzSession {
  bool usable = true;  // False once its creation was refused.
  bool large = false;  // A large cross session (kMinLargeKeys keys or more).
  SessionHistory history;
  std::unique_ptr<KvCache> cache;
};

// Reads a cross session's keys; OK with the session's history set, or the
// (expected) refusal.
absl::Status CreateCross(FuzzInput& in, const SessionEngine& engine, FuzzSession* s) {
  const MhaSpec& spec = engine.spec();
  SessionHistory& h = s->history;
  h.cross = true;
  h.is_causal = in.Bool();
  s->large = in.Percent(4);
  const int64_t keys =
      s->large ? in.Range(kMinLargeKeys, kMaxLargeKeys) : in.Range(1, kMaxCrossKeys);
  // Occasionally malformed: a key or value width or count, a mask length.
  const uint8_t bad = in.Percent(10) ? in.Range(1, 4) : 0;
  const int64_t kdim = spec.kdim + (bad == 1 ? 1 : 0);
  const int64_t value_rows = keys + (bad == 2 ? 1 : 0);
  const int64_t vdim = std::max<int64_t>(1, spec.vdim - (bad == 3 ? 1 : 0));
  h.key = MakeTensor(ReadFloatDType(in), {keys, kdim}, ReadValues(in, keys * kdim));
  h.value = MakeTensor(ReadFloatDType(in), {value_rows, vdim}, ReadValues(in, value_rows * vdim));
  const uint8_t mask = in.Byte() % 6;  // None, bool, float32, bfloat16, float16.
  const int64_t mask_len = keys + (bad == 4 ? 1 : 0);
  if (mask == 1) {
    Tensor m(DType::kBool, {mask_len});
    for (int64_t j = 0; j < mask_len; ++j) {
      m.mutable_as<bool>()[j] = j < kMaxReadValues ? in.Percent(30) : j % 4 == 3;
    }
    h.key_padding_mask = std::move(m);
  } else if (mask >= 2) {
    std::vector<float> v(static_cast<size_t>(mask_len));
    for (size_t j = 0; j < v.size(); ++j) {
      v[j] = static_cast<int64_t>(j) >= kMaxReadValues ? 0.0f
             : in.Percent(25)                          ? -INFINITY
                                                       : in.Value();
    }
    const DType dt = mask == 2 ? DType::kFloat32 : mask == 3 ? DType::kBFloat16 : DType::kFloat16;
    h.key_padding_mask = MakeTensor(dt, {mask_len}, v);
  }
  CrossKeys keys_view{h.key.view(), h.value.view(), std::nullopt};
  if (h.key_padding_mask) keys_view.key_padding_mask = h.key_padding_mask->view();
  // A float16 mask is valid (Infer takes one).
  const bool valid = kdim == spec.kdim && value_rows == keys && vdim == spec.vdim &&
                     (!h.key_padding_mask || mask_len == keys);
  const absl::Status verdict = engine.ValidateCross(keys_view);
  if (valid && !verdict.ok()) {
    return Bug(absl::StrCat("ValidateCross refused valid keys: ", verdict.ToString()));
  }
  if (!valid) {
    if (verdict.ok()) {
      return Bug(absl::StrCat("ValidateCross accepted key ", ShapeToString(h.key.shape()),
                              ", value ", ShapeToString(h.value.shape()), ", key_padding_mask ",
                              h.key_padding_mask ? ShapeToString(h.key_padding_mask->shape()) : "-",
                              " for kdim ", spec.kdim, ", vdim ", spec.vdim));
    }
    RETURN_IF_ERROR(CheckRefusal(verdict, absl::StatusCode::kInvalidArgument));
    s->usable = false;
    return absl::OkStatus();
  }
  const absl::Status init = Metered(engine.CrossWorkingBytes(keys), "InitCross",
                                    [&] { return engine.InitCross(keys_view, s->cache.get()); });
  if (!init.ok()) {
    RETURN_IF_ERROR(CheckRefusal(init, absl::StatusCode::kResourceExhausted));
    if (s->cache->length() != 0) return Bug("a failed InitCross left keys in the cache");
    s->usable = false;
    return absl::OkStatus();
  }
  if (s->cache->length() != keys) {
    return Bug(absl::StrCat("InitCross of ", keys, " keys left length ", s->cache->length()));
  }
  return absl::OkStatus();
}

// One session's step of a round, as read from the input.
struct Planned {
  size_t session = 0;
  std::vector<float> rows;     // (t, E) float32.
  std::vector<uint8_t> flags;  // not_key, when sent.
  Tensor tokens;
  std::optional<Tensor> not_key;
  bool valid = true;
  SessionStep step;
  std::vector<float> output, weights;
};

// Reads a step for session `index`; *planned->valid says whether the
// session engine must accept it.
void ReadStep(FuzzInput& in, const SessionEngine& engine, size_t index, const FuzzSession& s,
              Planned* p) {
  const MhaSpec& spec = engine.spec();
  const int64_t e = spec.embed_dim;
  const bool self_ok = spec.kdim == e && spec.vdim == e;
  p->session = index;
  int64_t t = in.Range(1, s.large ? kMaxLargeChunk : kMaxChunk);
  const uint8_t bad = in.Percent(8) ? in.Range(1, 4) : 0;
  if (bad == 1) t = 0;
  const int64_t width = bad == 2 ? e + 1 : e;
  p->rows = ReadValues(in, t * width);
  Shape shape = {t, width};
  if (bad == 3) shape.insert(shape.begin(), 1);
  p->tokens = MakeTensor(ReadFloatDType(in), shape, p->rows);
  const bool send_not_key = in.Percent(s.history.cross ? 5 : 40);
  if (send_not_key) {
    const int64_t n = bad == 4 ? t + 1 : t;
    p->flags.resize(static_cast<size_t>(n));
    Tensor m(DType::kBool, {n});
    for (int64_t i = 0; i < n; ++i) {
      p->flags[i] = in.Percent(30) ? 1 : 0;
      m.mutable_as<bool>()[i] = p->flags[i] != 0;
    }
    p->not_key = std::move(m);
  }
  const bool tokens_ok = t >= 1 && shape == Shape{t, e};
  const bool not_key_ok =
      !send_not_key || (!s.history.cross && static_cast<int64_t>(p->flags.size()) == t);
  p->valid = tokens_ok && not_key_ok && (s.history.cross || self_ok);
  SessionStep& st = p->step;
  st.cache = s.cache.get();
  st.cross = s.history.cross;
  st.is_causal = s.history.is_causal;
  st.position = s.history.length();
  st.tokens = p->tokens.view();
  if (p->not_key) st.not_key = p->not_key->view();
  st.need_weights = in.Percent(60);
  st.average_weights = in.Bool();
}

// A round: a step of each chosen session in one Run, then commit or drop.
absl::Status RunRound(FuzzInput& in, const MhaEngine& mha, const SessionEngine& engine,
                      std::vector<FuzzSession>& sessions) {
  const MhaSpec& spec = engine.spec();
  const uint8_t chosen = in.Byte();
  const bool commit_in_run = in.Bool();
  std::vector<Planned> planned;
  planned.reserve(sessions.size());
  for (size_t i = 0; i < sessions.size(); ++i) {
    FuzzSession& s = sessions[i];
    const int64_t max_tokens = s.large ? kMaxLargeTokens : kMaxTokens;
    if ((chosen >> i & 1) == 0 || !s.usable || s.history.length() >= max_tokens) continue;
    Planned p;
    ReadStep(in, engine, i, s, &p);
    const absl::Status verdict = engine.ValidateStep(p.step.cross, p.step.tokens, p.step.not_key);
    if (p.valid && !verdict.ok()) {
      return Bug(absl::StrCat("ValidateStep refused a valid step: ", verdict.ToString()));
    }
    if (!p.valid) {
      if (verdict.ok()) {
        return Bug(absl::StrCat("ValidateStep accepted a ", p.step.cross ? "cross" : "self",
                                " step of tokens ", ShapeToString(p.tokens.shape()), ", not_key ",
                                p.not_key ? ShapeToString(p.not_key->shape()) : "-",
                                " on a model with embed_dim ", spec.embed_dim, ", kdim ", spec.kdim,
                                ", vdim ", spec.vdim));
      }
      RETURN_IF_ERROR(CheckRefusal(verdict, absl::StatusCode::kInvalidArgument));
      continue;
    }
    const int64_t t = p.tokens.dim(0);
    if (!s.history.cross) {
      const absl::Status reserved = s.cache->Reserve(t);
      if (!reserved.ok()) {
        RETURN_IF_ERROR(CheckRefusal(reserved, absl::StatusCode::kResourceExhausted));
        continue;
      }
    }
    const int64_t columns = engine.WeightColumns(p.step);
    p.output.assign(static_cast<size_t>(t * spec.embed_dim), NAN);  // Every element written?
    p.weights.assign(
        p.step.need_weights
            ? static_cast<size_t>((p.step.average_weights ? 1 : spec.num_heads) * t * columns)
            : 0,
        NAN);
    p.step.output = p.output.data();
    p.step.weights = p.step.need_weights ? p.weights.data() : nullptr;
    planned.push_back(std::move(p));
  }
  if (planned.empty()) return absl::OkStatus();
  std::vector<SessionStep> steps;
  std::vector<int64_t> before;
  int64_t estimate = 0;  // A batch takes at most the sum of its steps'.
  for (const Planned& p : planned) {
    steps.push_back(p.step);
    before.push_back(p.step.cache->length());
    estimate += engine.StepWorkingBytes(p.tokens.dim(0), engine.WeightColumns(p.step),
                                        p.step.need_weights, p.step.average_weights);
  }
  const absl::Status run =
      Metered(estimate, "Run", [&] { return engine.Run(steps, commit_in_run); });
  if (!run.ok()) {
    RETURN_IF_ERROR(CheckRefusal(run, absl::StatusCode::kResourceExhausted));
    for (size_t a = 0; a < planned.size(); ++a) {
      if (planned[a].step.cache->length() != before[a])
        return Bug("a failed Run changed a session");
    }
    return absl::OkStatus();
  }
  for (size_t a = 0; a < planned.size(); ++a) {
    Planned& p = planned[a];
    FuzzSession& s = sessions[p.session];
    const int64_t t = p.tokens.dim(0);
    StepResult result{p.rows,          p.flags,         p.step.need_weights, p.step.average_weights,
                      p.output.data(), p.weights.data()};
    RETURN_IF_ERROR(CheckStep(mha, engine.cache_dtype(), s.history, result));
    // Kept: by Run, or committed now as the server does; else dropped.
    const bool keep = commit_in_run || in.Percent(80);
    if (!commit_in_run && keep && !s.history.cross) s.cache->Commit(before[a] + t);
    const int64_t expected = s.history.cross ? before[a] : before[a] + (keep ? t : 0);
    if (s.cache->length() != expected) {
      return Bug(absl::StrCat("session length ", s.cache->length(), " after a ",
                              keep ? "kept" : "dropped", " step of ", t, " tokens from ", before[a],
                              ", expected ", expected));
    }
    if (keep) s.history.Append(p.rows, p.flags, t);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FuzzOneSession(const uint8_t* data, size_t size) {
  static const bool once = (omp_set_num_threads(1), true);
  (void)once;
  FuzzInput in(data, size);
  uint64_t seed = 0;
  const MhaSpec spec = ReadSpec(in, &seed);
  ASSIGN_OR_RETURN(const MhaEngine* mha, EngineFor(spec, seed));
  const uint8_t setup = in.Byte();
  const DType cache_dtype = (setup & 1) != 0 ? DType::kBFloat16 : DType::kFloat32;
  // Mostly room for everything; sometimes none, so every Reserve fails.
  MemoryBudget budget((setup & 0xF0) == 0xF0 ? 0 : size_t{64} << 20);
  SessionEngine engine(mha, cache_dtype);
  KvBlockPool pool(engine.block_bytes(), &budget);
  absl::Status status = [&]() -> absl::Status {
    std::vector<FuzzSession> sessions(1 + (setup >> 1 & 3) % kMaxSessions);
    for (FuzzSession& s : sessions) {
      s.cache = std::make_unique<KvCache>(&pool, spec.num_heads, spec.head_dim(), cache_dtype);
      if (in.Percent(40)) RETURN_IF_ERROR(CreateCross(in, engine, &s));
    }
    for (int round = 0; round < kMaxRounds && !in.empty(); ++round) {
      RETURN_IF_ERROR(RunRound(in, *mha, engine, sessions));
    }
    return absl::OkStatus();
  }();
  if (status.ok() && (pool.used_bytes() != 0 || budget.used() != 0)) {
    status = Bug(absl::StrCat("closed sessions left ", pool.used_bytes(), " bytes of blocks and ",
                              budget.used(), " bytes of budget in use"));
  }
  return status;
}

}  // namespace attention::fuzz
