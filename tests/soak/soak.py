#!/usr/bin/python3
"""Soak test of attention-server: mixed load for a given duration, every answer verified.

Starts attention-server (--server) on a free port with a model repository of three models it
writes to a temporary folder, waits for grpc.health.v1 to report SERVING (Health/Watch), then:

1. Reference phase, alone and sequential: every request of a pool of pre-generated valid
   requests (random shapes, masks, dtypes, need_weights, self and cross attention) is sent once
   on its own (batch_requests must be 1); that answer is the engine's solo result. Each solo
   result is also checked against a float64 NumPy MultiheadAttention computed from the same
   weights and input bytes. Likewise every session script (self and cross sessions appended in
   chunks) is run alone and checked against one stateless Infer over its whole sequence.
2. Warm-up (--warmup seconds of the load below), then the server's RSS, open fds, threads and
   heap bytes in use are recorded ("start").
3. Load for --duration seconds from --workers threads over two channels: unary Infer,
   InferStream streams, sessions (CreateSession, Append or SessionStream, CloseSession),
   ListModels/GetModel; malformed requests (10% of stream messages, 8% of operations as unary
   Infer, plus session calls on closed or unknown sessions: about 15% of all calls) must get
   exactly the code expected (INVALID_ARGUMENT or NOT_FOUND) with a message; calls with
   deadlines short enough to expire (DEADLINE_EXCEEDED or a correct answer); cancelled unary
   calls and streams (CANCELLED or a correct answer). Every successful response is compared
   with the pool's solo result (tolerances below). Any other status (UNKNOWN, INTERNAL,
   RESOURCE_EXHAUSTED, UNAVAILABLE, ...) is a failure.
4. RSS, fds, threads and heap again ("end"); growth beyond the bounds fails the run. The
   server is stopped with SIGTERM and must exit 0 within 90 s (else its thread stacks are
   printed, with gdb); its log must contain no INTERNAL/UNKNOWN failures.

Tolerances against the solo result (|got - ref| <= atol + rtol * |ref|): float32 outputs of a
float32 model 1e-5 + 1e-5 (the README promises 1e-6 whatever the batch; 4.2e-7 seen); float16
outputs one float16 rounding step (1e-3 + 1e-3), bfloat16 outputs one bfloat16 step
(2e-3 + 8e-3); the bfloat16-compute model 2e-2 + 2e-2 (its projections are rounded to
bfloat16, so tiny differences between batched and solo GEMMs can flip a rounding; 7.8e-3
seen). Against float64: 1e-5 + 1e-5 for float32 models (float32 outputs; 8e-7 seen),
4e-2 + 2e-2 for the bfloat16 model (9.3e-3 seen), plus the output dtype's rounding.

Resource bounds, warm-up to end. Measured on the 2-core VM (BENCHMARKS.md "Soak"): over four
60 s runs RSS grew +12 to +34 MiB and the heap in use +2 to +16 MiB; over 600 s RSS grew
+39 MiB, flat from the 4th minute on, and the heap in use +16 MiB; fds and threads moved by
at most 1. So:
* RSS: max(25% of the start, 64 MiB). The server keeps up to 256 MiB of freed memory per
  malloc arena on purpose (M_TRIM_THRESHOLD) and glibc's per-thread arenas fill to their
  high-water marks as batch compositions vary, so RSS climbs to a plateau that a 10 s warm-up
  does not reach; the bound is about twice the worst growth seen. RSS alone cannot tell a leak
  from retained memory, hence:
* heap bytes in use (malloc_stats() called with gdb while the server is idle, at start and
  end; skipped when gdb cannot attach): +32 MiB, twice the worst seen (caches filling:
  oneDNN primitives, per-thread workspaces, remembered session ends). A leak of 1 KiB per
  call (about 55,000 calls a minute here) passes it within the 60 s run.
* open fds: +16 (a connection being replaced by --max_connection_age_s at the moment of the
  measure costs one or two; nothing else should open files).
* threads: +8 (gRPC's executor grows and shrinks its pool with load; a thread leaked per
  stream, session or connection passes 8 within seconds).

Exit 0 on success, 1 on any failure, with a summary. Run by CTest as soak_test (60 s);
longer: /usr/bin/python3 tests/soak/soak.py --server build/bin/attention-server --duration 600
"""
import argparse
import collections
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, os.path.join(REPO, "scripts"))

try:
    import grpc
    import numpy as np
    import torch  # Writes the models (scripts/export_torch_mha.py).
    from attention_client import client as ac  # Finds the generated stubs (ATTENTION_PY_GEN).
    from attention_client.client import (attention_pb2, attention_pb2_grpc, sessions_pb2,
                                         sessions_pb2_grpc)
except ImportError as e:  # CTest reports exit 77 as skipped.
    print(f"soak: skipped: {e} (run with Debian's /usr/bin/python3: python3-grpcio, "
          f"python3-numpy, python3-torch; build the project for the stubs)")
    sys.exit(77)

F32, BF16, F16, BOOL = (attention_pb2.DATA_TYPE_FLOAT32, attention_pb2.DATA_TYPE_BFLOAT16,
                        attention_pb2.DATA_TYPE_FLOAT16, attention_pb2.DATA_TYPE_BOOL)
DTYPE_NAME = {F32: "float32", BF16: "bfloat16", F16: "float16", BOOL: "bool",
              attention_pb2.DATA_TYPE_UNSPECIFIED: "unspecified"}
SC = grpc.StatusCode
CODES = {c.value[0]: c for c in SC}

# The served models: name -> torch.nn.MultiheadAttention arguments, storage and compute dtype.
MODELS = {
    # Self and cross attention, float32 weights and compute; the default model.
    "mha_f32": dict(embed_dim=128, num_heads=8, bias=True, add_bias_kv=False, add_zero_attn=False,
                    kdim=None, vdim=None, store="float32", compute="float32"),
    # Cross attention only (kdim, vdim != embed_dim), bias_kv and zero_attn keys, bfloat16
    # weights and compute.
    "mha_cross_bf16": dict(embed_dim=64, num_heads=4, bias=True, add_bias_kv=True,
                           add_zero_attn=True, kdim=48, vdim=80, store="bfloat16",
                           compute="bfloat16"),
    # No bias, a zero-attention key, float16 weights, float32 compute, head_dim 32.
    "mha_f16w": dict(embed_dim=96, num_heads=3, bias=False, add_bias_kv=False, add_zero_attn=True,
                     kdim=None, vdim=None, store="float16", compute="float32"),
}
DEFAULT_MODEL = "mha_f32"


# ----------------------------------------------------------------------------------------------
# Tensors


def bf16_words(x):
    return ac.float32_to_bfloat16(np.asarray(x, np.float32))


def make_tensor(values, dtype):
    """An attention.v1.Tensor of `values` (float64/float32/bool array) in `dtype`; returns the
    tensor and the values it actually carries (after rounding to dtype), as float64 / bool."""
    values = np.asarray(values)
    t = attention_pb2.Tensor(dtype=dtype, shape=list(values.shape))
    if dtype == BOOL:
        t.data = np.ascontiguousarray(values, dtype=np.bool_).tobytes()
        return t, values.astype(bool)
    if dtype == F32:
        a = np.ascontiguousarray(values, dtype="<f4")
        t.data = a.tobytes()
        return t, a.astype(np.float64)
    if dtype == F16:
        a = np.ascontiguousarray(values, dtype="<f2")
        t.data = a.tobytes()
        return t, a.astype(np.float64)
    words = bf16_words(values)
    t.data = words.astype("<u2").tobytes()
    return t, ac.bfloat16_to_float32(words).astype(np.float64)


def decode(t):
    """A response tensor as float32 values (None if absent)."""
    if not t.shape:
        return None
    if t.dtype == F32:
        return np.frombuffer(t.data, "<f4").reshape(tuple(t.shape)).astype(np.float32)
    if t.dtype == F16:
        return np.frombuffer(t.data, "<f2").reshape(tuple(t.shape)).astype(np.float32)
    if t.dtype == BF16:
        return ac.bfloat16_to_float32(np.frombuffer(t.data, "<u2")).reshape(tuple(t.shape))
    raise ValueError(f"unexpected output dtype {t.dtype}")


# ----------------------------------------------------------------------------------------------
# Models and the float64 reference


def write_models(repo_dir, seed):
    """Writes the model repository; returns name -> float64 weights as the server reads them."""
    from export_torch_mha import export_mha
    torch.manual_seed(seed)
    weights = {}
    for name, m in MODELS.items():
        module = torch.nn.MultiheadAttention(m["embed_dim"], m["num_heads"], bias=m["bias"],
                                             add_bias_kv=m["add_bias_kv"],
                                             add_zero_attn=m["add_zero_attn"], kdim=m["kdim"],
                                             vdim=m["vdim"], batch_first=True)
        with torch.no_grad():  # Non-zero biases, so that they matter.
            for pname, p in module.named_parameters():
                if "bias" in pname:
                    p.copy_(torch.randn_like(p) * 0.1)
        export_mha(module, os.path.join(repo_dir, name), dtype=m["store"],
                   compute_dtype=m["compute"])
        store = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                 "float16": torch.float16}[m["store"]]
        weights[name] = {k: v.detach().to(store).to(torch.float64).numpy()
                         for k, v in module.state_dict().items()}
    return weights


def spec(name):
    m = MODELS[name]
    e = m["embed_dim"]
    return e, m["num_heads"], m["kdim"] or e, m["vdim"] or e


def reference_mha(name, w, q, k, v, kpm, am, is_causal, need_weights, per_head):
    """float64 torch.nn.MultiheadAttention (batch-first, inference) with the engine's
    convention for fully masked rows (zero weights, zero context). q (N, L, E); k, v (N, S, *)
    or None; kpm (N, S) bool or float or None; am (L, S) or (N*H, L, S) or None."""
    m = MODELS[name]
    e, h, _, _ = spec(name)
    d = e // h
    n, l, _ = q.shape
    if k is None:
        k = q
    if v is None:
        v = k
    s = k.shape[1]
    if "in_proj_weight" in w:
        wq, wk, wv = np.split(w["in_proj_weight"], 3)
    else:
        wq, wk, wv = w["q_proj_weight"], w["k_proj_weight"], w["v_proj_weight"]
    bq = bk = bv = 0.0
    if m["bias"]:
        bq, bk, bv = np.split(w["in_proj_bias"], 3)
    qp = q @ wq.T + bq
    kp = k @ wk.T + bk
    vp = v @ wv.T + bv
    if m["add_bias_kv"]:
        kp = np.concatenate([kp, np.broadcast_to(w["bias_k"].reshape(1, 1, e), (n, 1, e))], 1)
        vp = np.concatenate([vp, np.broadcast_to(w["bias_v"].reshape(1, 1, e), (n, 1, e))], 1)
    if m["add_zero_attn"]:
        kp = np.concatenate([kp, np.zeros((n, 1, e))], 1)
        vp = np.concatenate([vp, np.zeros((n, 1, e))], 1)
    sp = kp.shape[1]
    mask = np.zeros((n, h, l, sp))
    if kpm is not None:
        add = np.where(kpm, -np.inf, 0.0) if kpm.dtype == bool else kpm
        mask[:, :, :, :s] += add[:, None, None, :]
    if am is not None:
        add = np.where(am, -np.inf, 0.0) if am.dtype == bool else am
        mask[:, :, :, :s] += add[None, None] if add.ndim == 2 else add.reshape(n, h, l, s)
    if is_causal:
        causal = np.triu(np.ones((l, s), bool), 1)
        mask[:, :, :, :s] += np.where(causal, -np.inf, 0.0)
    qh = qp.reshape(n, l, h, d).transpose(0, 2, 1, 3) / np.sqrt(d)
    kh = kp.reshape(n, sp, h, d).transpose(0, 2, 1, 3)
    vh = vp.reshape(n, sp, h, d).transpose(0, 2, 1, 3)
    with np.errstate(invalid="ignore", over="ignore"):
        scores = qh @ kh.transpose(0, 1, 3, 2) + mask
        top = scores.max(-1, keepdims=True)
        dead = ~np.isfinite(top)
        p = np.exp(scores - np.where(dead, 0.0, top))
        total = p.sum(-1, keepdims=True)
        p = np.where(dead, 0.0, p / np.where(dead, 1.0, total))
    ctx = (p @ vh).transpose(0, 2, 1, 3).reshape(n, l, e)
    out = ctx @ w["out_proj.weight"].T + (w["out_proj.bias"] if m["bias"] else 0.0)
    weights = None
    if need_weights:
        weights = p if per_head else p.mean(1)
    return out, weights


# ----------------------------------------------------------------------------------------------
# Tolerances


def rounding_tol(out_dtype):
    """(atol, rtol) of one rounding step of the output dtype."""
    return {F32: (0.0, 0.0), F16: (1e-3, 1e-3), BF16: (2e-3, 8e-3)}[out_dtype]


def solo_tol(model, out_dtype):
    """Batched response against the solo response."""
    if MODELS[model]["compute"] == "bfloat16":
        return 2e-2, 2e-2
    a, r = rounding_tol(out_dtype)
    return a + 1e-5, r + 1e-5


def f64_tol(model, out_dtype):
    """The solo response against float64."""
    a, r = rounding_tol(out_dtype)
    if MODELS[model]["compute"] == "bfloat16":
        return a + 4e-2, r + 2e-2
    return a + 1e-5, r + 1e-5


def compare(got, want, atol, rtol):
    """None if |got - want| <= atol + rtol |want| everywhere, else a description."""
    if got is None or want is None:
        if got is None and want is None:
            return None
        return f"presence differs (got {'none' if got is None else got.shape}, want "\
               f"{'none' if want is None else want.shape})"
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bad = ~(diff <= atol + rtol * np.abs(want))  # NaN counts as bad.
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"{int(bad.sum())} of {bad.size} values off; first at {list(idx)}: got "
                f"{got[idx]!r} want {want[idx]!r} (max |diff| {np.nanmax(diff):.3g}, "
                f"atol {atol:g} rtol {rtol:g})")
    return None


def max_abs_diff(got, want):
    if got is None or want is None or got.shape != want.shape or got.size == 0:
        return 0.0
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))


# ----------------------------------------------------------------------------------------------
# The request pool


class PoolEntry:
    """A valid InferRequest, its description, and (after the reference phase) its solo
    response's output and weights."""

    def __init__(self, index, model, request, desc, inputs, out_dtype):
        self.index = index
        self.model = model        # The served name (request.model may be "" for the default).
        self.request = request
        self.desc = desc
        self.inputs = inputs      # Values as sent, for the float64 reference.
        self.out_dtype = out_dtype
        self.output = None
        self.weights = None


def random_float_mask(rng, shape, dtype):
    values = rng.standard_normal(shape) * 2.0
    if rng.random() < 0.3:  # A few -inf entries.
        values[rng.random(shape) < 0.15] = -np.inf
    return make_tensor(values, dtype)


def random_request(rng, index, model):
    e, h, kdim, vdim = spec(model)
    cross_only = kdim != e or vdim != e
    batched = rng.random() < 0.85
    n = int(rng.integers(1, 5)) if batched else 1
    l = int(rng.integers(1, 41))
    cross = cross_only or rng.random() < 0.35
    s = int(rng.integers(1, 49)) if cross else l
    in_dtype = rng.choice([F32, F32, F32, BF16, F16])
    out_choice = rng.choice([0, 0, F32, BF16, F16])
    out_dtype = in_dtype if out_choice == 0 else out_choice
    req = attention_pb2.InferRequest(model="" if model == DEFAULT_MODEL and rng.random() < 0.3
                                     else model)
    req.output_dtype = int(out_choice)
    lead = (n,) if batched else ()
    desc = [model, "batched" if batched else "unbatched", f"N={n} L={l} S={s}",
            f"in={DTYPE_NAME[in_dtype]} out={DTYPE_NAME[out_dtype]}"]
    t, q = make_tensor(rng.standard_normal(lead + (l, e)), in_dtype)
    req.query.CopyFrom(t)
    k = v = None
    if cross:
        t, k = make_tensor(rng.standard_normal(lead + (s, kdim)), in_dtype)
        req.key.CopyFrom(t)
        desc.append("cross")
        if vdim != kdim or rng.random() < 0.6:
            t, v = make_tensor(rng.standard_normal(lead + (s, vdim)), in_dtype)
            req.value.CopyFrom(t)
        else:
            v = k
            desc.append("value=key")
    kpm = am = None
    r = rng.random()
    if r < 0.3:
        mask = rng.random(lead + (s,)) < 0.3
        if rng.random() < 0.1:
            mask[...] = True  # Every key masked (fully masked rows where no extra keys).
        t, kpm = make_tensor(mask, BOOL)
        req.key_padding_mask.CopyFrom(t)
        desc.append("kpm=bool")
    elif r < 0.5:
        mdtype = rng.choice([F32, BF16, F16])
        t, kpm = random_float_mask(rng, lead + (s,), mdtype)
        req.key_padding_mask.CopyFrom(t)
        desc.append(f"kpm={DTYPE_NAME[mdtype]}")
    r = rng.random()
    if r < 0.45:
        three_d = rng.random() < 0.5
        shape = ((n * h if batched else h), l, s) if three_d else (l, s)
        if rng.random() < 0.5:
            t, am = make_tensor(rng.random(shape) < 0.25, BOOL)
            mdtype = BOOL
        else:
            mdtype = rng.choice([F32, BF16, F16])
            t, am = random_float_mask(rng, shape, mdtype)
        req.attn_mask.CopyFrom(t)
        desc.append(f"attn_mask={'3d' if three_d else '2d'}/{DTYPE_NAME[mdtype]}")
    if rng.random() < 0.25:
        req.is_causal = True
        desc.append("causal")
    if rng.random() < 0.3:
        req.need_weights = True
        req.per_head_weights = bool(rng.random() < 0.5)
        desc.append("weights/head" if req.per_head_weights else "weights")

    def batch(x):
        return None if x is None else (x if batched else x[None])
    inputs = dict(q=batch(q), k=batch(k) if cross else None, v=batch(v) if cross else None,
                  kpm=batch(kpm), am=am, batched=batched)
    return PoolEntry(index, model, req, " ".join(desc), inputs, out_dtype)


# Malformed requests: (description, expected code, mutation of a copy of a valid request).
def _set_data(t, delta):
    t.data = t.data[:len(t.data) + delta] if delta < 0 else t.data + b"\0" * delta


def _resize_last(t, extra):
    shape = list(t.shape)
    shape[-1] += extra
    t.shape[:] = shape
    itemsize = {F32: 4, BF16: 2, F16: 2, BOOL: 1}[t.dtype]
    t.data = b"\0" * (int(np.prod(shape)) * itemsize)


def _mal_dims(t, shape):
    t.shape[:] = shape
    t.data = b""


MALFORMED = [
    ("unknown model", SC.NOT_FOUND, lambda r, e: setattr(r, "model", "no_such_model")),
    ("query embed_dim + 1", SC.INVALID_ARGUMENT, lambda r, e: _resize_last(r.query, 1)),
    ("query data 3 bytes short", SC.INVALID_ARGUMENT, lambda r, e: _set_data(r.query, -3)),
    ("query data 2 bytes long", SC.INVALID_ARGUMENT, lambda r, e: _set_data(r.query, 2)),
    ("query dtype unspecified", SC.INVALID_ARGUMENT,
     lambda r, e: setattr(r.query, "dtype", attention_pb2.DATA_TYPE_UNSPECIFIED)),
    ("query dtype 77", SC.INVALID_ARGUMENT, lambda r, e: setattr(r.query, "dtype", 77)),
    ("query bool", SC.INVALID_ARGUMENT, lambda r, e: (
        setattr(r.query, "dtype", BOOL),
        setattr(r.query, "data", b"\0" * int(np.prod(list(r.query.shape)))))),
    ("query rank 4", SC.INVALID_ARGUMENT, lambda r, e: (
        r.query.shape.__setitem__(slice(None), [1, 1] + list(r.query.shape[-2:])))),
    ("query dim 0", SC.INVALID_ARGUMENT, lambda r, e: _mal_dims(r.query, [1, 0, e])),
    ("query dim -3", SC.INVALID_ARGUMENT, lambda r, e: _mal_dims(r.query, [-3, 2, e])),
    ("query 9 dims", SC.INVALID_ARGUMENT, lambda r, e: _mal_dims(r.query, [1] * 8 + [e])),
    ("query 2^62 elements", SC.INVALID_ARGUMENT,
     lambda r, e: _mal_dims(r.query, [1 << 31, 1 << 31, e])),
    ("no query", SC.INVALID_ARGUMENT, lambda r, e: r.ClearField("query")),
    ("output_dtype bool", SC.INVALID_ARGUMENT, lambda r, e: setattr(r, "output_dtype", BOOL)),
    ("output_dtype 9", SC.INVALID_ARGUMENT, lambda r, e: setattr(r, "output_dtype", 9)),
    ("key_padding_mask S + 1", SC.INVALID_ARGUMENT, lambda r, e: (
        r.key_padding_mask.CopyFrom(attention_pb2.Tensor(dtype=BOOL)),
        r.key_padding_mask.shape.extend(list(r.query.shape[:-2]) + [_keys(r) + 1]),
        setattr(r.key_padding_mask, "data",
                b"\0" * int(np.prod(list(r.key_padding_mask.shape)))))),
    ("key_padding_mask float data 1 byte short", SC.INVALID_ARGUMENT, lambda r, e: (
        r.key_padding_mask.CopyFrom(attention_pb2.Tensor(dtype=F32)),
        r.key_padding_mask.shape.extend(list(r.query.shape[:-2]) + [_keys(r)]),
        setattr(r.key_padding_mask, "data",
                b"\0" * (4 * int(np.prod(list(r.key_padding_mask.shape))) - 1)))),
    ("attn_mask (L + 1, S)", SC.INVALID_ARGUMENT, lambda r, e: (
        r.attn_mask.CopyFrom(attention_pb2.Tensor(dtype=F32, shape=[r.query.shape[-2] + 1,
                                                                    _keys(r)])),
        setattr(r.attn_mask, "data", b"\0" * (4 * (r.query.shape[-2] + 1) * _keys(r))))),
    ("attn_mask 3-D first dim N*H + 1", SC.INVALID_ARGUMENT, lambda r, e: (
        r.attn_mask.CopyFrom(attention_pb2.Tensor(dtype=BOOL, shape=[
            _heads(r) * (r.query.shape[0] if len(r.query.shape) == 3 else 1) + 1,
            r.query.shape[-2], _keys(r)])),
        setattr(r.attn_mask, "data", b"\0" * int(np.prod(list(r.attn_mask.shape)))))),
    ("value without key", SC.INVALID_ARGUMENT, lambda r, e: (
        r.ClearField("key"), r.value.CopyFrom(r.query))),
    ("key batch N + 1", SC.INVALID_ARGUMENT, lambda r, e: (
        r.key.CopyFrom(attention_pb2.Tensor(dtype=F32, shape=[r.query.shape[0] + 1, 3, e])
                       if len(r.query.shape) == 3 else
                       attention_pb2.Tensor(dtype=F32, shape=[2, 3, 3, e])),
        setattr(r.key, "data", b"\0" * (4 * int(np.prod(list(r.key.shape))))),
        r.ClearField("value"), r.ClearField("key_padding_mask"), r.ClearField("attn_mask"))),
]


def _keys(r):
    return r.key.shape[-2] if r.HasField("key") else r.query.shape[-2]


def _heads(r):
    return MODELS[r.model or DEFAULT_MODEL]["num_heads"] if (r.model or DEFAULT_MODEL) in MODELS \
        else 1


def malformed_request(rng, pool):
    entry = pool[int(rng.integers(len(pool)))]
    desc, code, mutate = MALFORMED[int(rng.integers(len(MALFORMED)))]
    req = attention_pb2.InferRequest()
    req.CopyFrom(entry.request)
    req.model = entry.model
    e = spec(entry.model)[0]
    if desc.startswith("key batch") and MODELS[entry.model]["kdim"]:
        e = MODELS[entry.model]["kdim"]
    mutate(req, e)
    return req, desc, code


# ----------------------------------------------------------------------------------------------
# Session scripts


class SessionScript:
    """A session's creation request, its chunks (AppendRequests without session_id) and the
    solo session's outputs (and weights) per chunk, filled by the reference phase."""

    def __init__(self, index, model, create, chunks, desc, infer_request):
        self.index = index
        self.model = model
        self.create = create
        self.chunks = chunks
        self.desc = desc
        self.infer_request = infer_request  # The stateless equivalent over the whole sequence.
        self.outputs = []
        self.weights = []


def random_session(rng, index, model):
    e, _, kdim, vdim = spec(model)
    t_total = int(rng.integers(1, 49))
    cuts = sorted(set(int(c) for c in rng.integers(1, t_total, size=int(rng.integers(0, 6))))) \
        if t_total > 1 else []
    sizes = np.diff([0] + cuts + [t_total]).tolist()
    x = rng.standard_normal((t_total, e))
    infer = attention_pb2.InferRequest(model=model)
    infer.query.CopyFrom(make_tensor(x[None], F32)[0])
    need_weights = bool(rng.random() < 0.3)
    desc = [model]
    if kdim == e and vdim == e:
        create = sessions_pb2.CreateSessionRequest(model=model, kind=sessions_pb2.SESSION_KIND_SELF)
        not_key = rng.random(t_total) < 0.1 if rng.random() < 0.4 else None
        infer.is_causal = True
        if not_key is not None:
            infer.key_padding_mask.CopyFrom(make_tensor(not_key[None], BOOL)[0])
        desc.append(f"self T={t_total} chunks={sizes}" + (" not_key" if not_key is not None
                                                           else ""))
    else:
        s = int(rng.integers(1, 33))
        key, value = rng.standard_normal((s, kdim)), rng.standard_normal((s, vdim))
        create = sessions_pb2.CreateSessionRequest(model=model,
                                                   kind=sessions_pb2.SESSION_KIND_CROSS)
        create.key.CopyFrom(make_tensor(key, F32)[0])
        create.value.CopyFrom(make_tensor(value, F32)[0])
        infer.key.CopyFrom(make_tensor(key[None], F32)[0])
        infer.value.CopyFrom(make_tensor(value[None], F32)[0])
        if rng.random() < 0.4:
            mask = rng.random(s) < 0.3
            create.key_padding_mask.CopyFrom(make_tensor(mask, BOOL)[0])
            infer.key_padding_mask.CopyFrom(make_tensor(mask[None], BOOL)[0])
        if rng.random() < 0.4:
            create.is_causal = infer.is_causal = True
        not_key = None
        desc.append(f"cross S={s} T={t_total} chunks={sizes}"
                    + (" kpm" if create.HasField("key_padding_mask") else "")
                    + (" causal" if create.is_causal else ""))
    chunks, at = [], 0
    for size in sizes:
        a = sessions_pb2.AppendRequest(need_weights=need_weights)
        a.tokens.CopyFrom(make_tensor(x[at:at + size], F32)[0])
        if not_key is not None:
            a.not_key.CopyFrom(make_tensor(not_key[at:at + size], BOOL)[0])
        chunks.append(a)
        at += size
    return SessionScript(index, model, create, chunks, " ".join(desc), infer)


# ----------------------------------------------------------------------------------------------
# The server process


def thread_stacks(pid):
    """Every thread's stack of process pid (gdb), or why not."""
    try:
        out = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off",
                              "-ex", "thread apply all bt"], capture_output=True, text=True,
                             timeout=120)
        return out.stdout[-60000:]
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no stacks: {e})"


class Server:
    def __init__(self, binary, repo_dir, log_path, extra_args):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.lines = []
        self.port = None
        self._listening = threading.Event()
        args = [binary, "--host=127.0.0.1", "--port=0", "--metrics_port=0", "--http_port=0",
                f"--model_repository={repo_dir}", f"--default_model={DEFAULT_MODEL}"] + extra_args
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            self.log.write(line)
            self.log.flush()
            found = re.search(r"listening on port (\d+)", line)
            if found:
                self.port = int(found.group(1))
                self._listening.set()
        self._listening.set()  # EOF: the process ended.

    def wait_listening(self, timeout):
        if not self._listening.wait(timeout) or self.port is None:
            raise RuntimeError("attention-server did not print its port:\n" + self.tail())

    def wait_serving(self, timeout):
        """Blocks on grpc.health.v1.Health/Watch until the server reports SERVING."""
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                         request_serializer=ac._health_request,
                                         response_deserializer=ac._health_status)
            for status in watch("", timeout=timeout, wait_for_ready=True):
                if status == 1:  # SERVING
                    return

    def resources(self):
        pid = self.proc.pid
        rss = threads = None
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return {"rss": rss, "fds": fds, "threads": threads}

    def stop(self, timeout=90):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.lines.append(f"(soak: no exit {timeout} s after SIGTERM; thread stacks follow)")
            self.lines.extend(thread_stacks(self.proc.pid).splitlines())
            self.proc.kill()
            rc = self.proc.wait()
            self.lines.append(f"(soak: killed after {timeout} s without exiting on SIGTERM)")
        self._reader.join(timeout=10)
        self.log.close()
        return rc

    def heap_in_use(self):
        """Bytes glibc malloc has handed out and not had back (every arena, mmap included), by
        calling malloc_stats() in the server with gdb; None if that is not possible. Call it
        only while the server is idle: gdb stops the process for about a second. Unlike RSS,
        this does not count freed memory the heap keeps (M_TRIM_THRESHOLD, fragmentation), so
        its growth is what a leak looks like."""
        mark = len(self.lines)
        try:
            subprocess.run(["gdb", "-p", str(self.proc.pid), "-batch", "-nx", "-ex",
                            "call (void)malloc_stats()"], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            block = self.lines[mark:]
            if "Total (incl. mmap):" in block:
                rest = block[block.index("Total (incl. mmap):"):]
                for line in rest:
                    if line.startswith("in use bytes"):
                        return int(line.split("=")[1])
            time.sleep(0.05)
        return None

    def tail(self, n=30):
        stacks = [i for i, line in enumerate(self.lines) if "thread stacks follow" in line]
        if stacks:  # Everything from the stacks on (they are the story).
            return "\n".join(self.lines[max(0, stacks[0] - 5):])
        return "\n".join(self.lines[-n:])


# ----------------------------------------------------------------------------------------------
# The soak


class Soak:
    def __init__(self, args, pool, sessions, target):
        self.args = args
        self.pool = pool
        self.by_model = collections.defaultdict(list)
        for p in pool:
            self.by_model[p.model].append(p)
        self.sessions = sessions
        options = ac._channel_options(ac.service_config("round_robin"))
        self.channels = [grpc.insecure_channel(target, options=options) for _ in range(2)]
        self.stubs = [(attention_pb2_grpc.AttentionServiceStub(c),
                       sessions_pb2_grpc.SessionServiceStub(c)) for c in self.channels]
        self.lock = threading.Lock()
        self.outcomes = collections.Counter()  # (kind, outcome) -> count
        self.failures = []
        self.failure_count = 0
        self.max_diff = collections.defaultdict(float)  # category -> max |batched - solo|
        self.stop_at = 0.0
        self.counting = False
        self.ids = iter(range(1 << 62))
        self.ids_lock = threading.Lock()

    # Bookkeeping ------------------------------------------------------------------------------

    def next_id(self):
        with self.ids_lock:
            return next(self.ids)

    def count(self, kind, outcome, n=1):
        with self.lock:
            self.outcomes[(kind, outcome)] += n

    def fail(self, message):
        with self.lock:
            self.failure_count += 1
            if len(self.failures) < 50:
                self.failures.append(message)
        self.count("all", "FAILED")

    def note_diff(self, category, got, want):
        d = max_abs_diff(got, want)
        with self.lock:
            if d > self.max_diff[category]:
                self.max_diff[category] = d

    # Verification -----------------------------------------------------------------------------

    def verify_infer(self, kind, entry, response, request_id):
        if response.request_id != request_id:
            self.fail(f"{kind} pool#{entry.index}: request_id {response.request_id!r} != "
                      f"{request_id!r}")
            return
        if response.HasField("error") and response.error.code != 0:
            self.fail(f"{kind} pool#{entry.index} [{entry.desc}]: error "
                      f"{response.error.code} {response.error.message}")
            return
        atol, rtol = solo_tol(entry.model, entry.out_dtype)
        out, weights = decode(response.output), decode(response.attn_weights)
        for field, got, want in (("output", out, entry.output),
                                 ("attn_weights", weights, entry.weights)):
            problem = compare(got, want, atol, rtol)
            if problem:
                self.fail(f"{kind} pool#{entry.index} [{entry.desc}] batch_requests="
                          f"{response.batch_requests}: {field} differs from the solo result: "
                          f"{problem}")
                return
        category = f"{MODELS[entry.model]['compute']}-compute, {DTYPE_NAME[entry.out_dtype]} out"
        self.note_diff(category, out, entry.output)
        self.note_diff(category, weights, entry.weights)
        self.count(kind, "OK")

    def expect_code(self, kind, code, allowed, what):
        if code in allowed:
            self.count(kind, code.name)
        else:
            self.fail(f"{kind} {what}: got {code.name if code else code}, expected "
                      f"{'/'.join(c.name for c in allowed)}")

    # Operations -------------------------------------------------------------------------------

    def pick(self, rng):
        return self.pool[int(rng.integers(len(self.pool)))]

    def request_of(self, entry):
        req = attention_pb2.InferRequest()
        req.CopyFrom(entry.request)
        req.request_id = f"r{self.next_id()}"
        return req

    def op_unary(self, rng, stub, timeout=30.0, kind="unary"):
        entry = self.pick(rng)
        req = self.request_of(entry)
        try:
            response = stub.Infer(req, timeout=timeout)
        except grpc.RpcError as e:
            allowed = (SC.DEADLINE_EXCEEDED,) if kind == "unary_deadline" else ()
            self.expect_code(kind, e.code(), allowed,
                             f"pool#{entry.index} [{entry.desc}] ({e.details()})")
            return
        self.verify_infer(kind, entry, response, req.request_id)

    def op_unary_deadline(self, rng, stub):
        self.op_unary(rng, stub, timeout=float(rng.uniform(0.0002, 0.01)), kind="unary_deadline")

    def op_unary_cancel(self, rng, stub):
        entry = self.pick(rng)
        req = self.request_of(entry)
        future = stub.Infer.future(req, timeout=30.0)
        time.sleep(float(rng.uniform(0, 0.004)))
        future.cancel()
        try:
            response = future.result()
        except grpc.FutureCancelledError:
            self.count("unary_cancel", "CANCELLED")
            return
        except grpc.RpcError as e:
            self.expect_code("unary_cancel", e.code(), (SC.CANCELLED,),
                             f"pool#{entry.index} [{entry.desc}] ({e.details()})")
            return
        self.verify_infer("unary_cancel", entry, response, req.request_id)

    def op_malformed(self, rng, stub):
        req, desc, code = malformed_request(rng, self.pool)
        try:
            stub.Infer(req, timeout=30.0)
        except grpc.RpcError as e:
            self.expect_code("malformed", e.code(), (code,), f"'{desc}' ({e.details()})")
            if e.code() == code and not e.details():
                self.fail(f"malformed '{desc}': {code.name} without a message")
            return
        self.fail(f"malformed '{desc}': answered OK, expected {code.name}")

    def stream_requests(self, rng, count):
        """count stream requests, ~10% malformed: [(request, entry or None, expected code)]."""
        out = []
        for _ in range(count):
            if rng.random() < 0.1:
                req, desc, code = malformed_request(rng, self.pool)
                req.request_id = f"m{self.next_id()}"
                out.append((req, desc, code))
            else:
                entry = self.pick(rng)
                out.append((self.request_of(entry), entry, None))
        return out

    def check_stream_response(self, kind, response, by_id, seen, allowed=()):
        """allowed: error codes a valid request's response may carry (a stream's deadline
        passing while the request is queued answers it DEADLINE_EXCEEDED in its response)."""
        rid = response.request_id
        if rid not in by_id or rid in seen:
            self.fail(f"{kind}: unexpected or repeated response request_id {rid!r}")
            return
        seen.add(rid)
        _, what, code = by_id[rid]
        if code is None:
            error = CODES.get(response.error.code) if response.HasField("error") else None
            if error is not None and error in allowed:
                self.count(kind, error.name)
                return
            self.verify_infer(kind, what, response, rid)
        else:
            got = SC.OK if not response.HasField("error") else CODES.get(response.error.code)
            if got == code:
                self.count(kind, "malformed:" + code.name)
                if not response.error.message:
                    self.fail(f"{kind} malformed '{what}': {code.name} without a message")
            else:
                self.fail(f"{kind} malformed '{what}': got {got.name if got else got} "
                          f"({response.error.message}), expected {code.name}")

    def op_stream(self, rng, stub, timeout=60.0, kind="stream"):
        items = self.stream_requests(rng, int(rng.integers(2, 13)))
        by_id = {req.request_id: (req, what, code) for req, what, code in items}
        seen = set()
        try:
            for response in stub.InferStream(iter([r for r, _, _ in items]), timeout=timeout):
                self.check_stream_response(kind, response, by_id, seen,
                                           (SC.DEADLINE_EXCEEDED,) if kind == "stream_deadline"
                                           else ())
        except grpc.RpcError as e:
            allowed = (SC.DEADLINE_EXCEEDED,) if kind == "stream_deadline" else ()
            self.expect_code(kind, e.code(), allowed, f"stream ({e.details()})")
            return
        if len(seen) != len(items):
            self.fail(f"{kind}: {len(items)} requests, {len(seen)} responses")

    def op_stream_deadline(self, rng, stub):
        self.op_stream(rng, stub, timeout=float(rng.uniform(0.001, 0.02)), kind="stream_deadline")

    def op_stream_cancel(self, rng, stub):
        """Sends some requests on a stream that stays open, reads a few answers, cancels."""
        items = self.stream_requests(rng, int(rng.integers(2, 13)))
        by_id = {req.request_id: (req, what, code) for req, what, code in items}
        feed = queue.Queue()
        for req, _, _ in items:
            feed.put(req)
        done = object()

        def requests():
            while True:
                item = feed.get()
                if item is done:
                    return
                yield item
        call = stub.InferStream(requests(), timeout=60.0)
        read_before_cancel = int(rng.integers(0, len(items)))
        seen = set()
        if read_before_cancel == 0:
            time.sleep(float(rng.uniform(0, 0.003)))
            call.cancel()
        try:
            for response in call:
                self.check_stream_response("stream_cancel", response, by_id, seen,
                                           (SC.CANCELLED,))
                if len(seen) >= read_before_cancel:
                    call.cancel()
            self.fail("stream_cancel: the stream ended without CANCELLED")
        except grpc.RpcError as e:
            self.expect_code("stream_cancel", e.code(), (SC.CANCELLED,), f"({e.details()})")
        finally:
            call.cancel()
            feed.put(done)

    def op_session(self, rng, stub):
        script = self.sessions[int(rng.integers(len(self.sessions)))]
        try:
            info = stub.CreateSession(script.create, timeout=30.0)
        except grpc.RpcError as e:
            self.fail(f"session#{script.index} [{script.desc}]: CreateSession {e.code().name} "
                      f"({e.details()})")
            return
        sid = info.session_id
        use_stream = rng.random() < 0.5
        appends = []
        for c in script.chunks:
            a = sessions_pb2.AppendRequest()
            a.CopyFrom(c)
            a.session_id = sid
            a.request_id = f"a{self.next_id()}"
            appends.append(a)
        try:
            if use_stream:
                responses = list(stub.SessionStream(iter(appends), timeout=60.0))
            else:
                responses = [stub.Append(a, timeout=30.0) for a in appends]
        except grpc.RpcError as e:
            self.fail(f"session#{script.index} [{script.desc}] "
                      f"{'SessionStream' if use_stream else 'Append'}: {e.code().name} "
                      f"({e.details()})")
            responses = None
        kind = "session_stream" if use_stream else "session_append"
        if responses is not None:
            if [r.request_id for r in responses] != [a.request_id for a in appends]:
                self.fail(f"session#{script.index}: responses out of order or missing")
            else:
                at = 0
                for i, (a, r) in enumerate(zip(appends, responses)):
                    at += a.tokens.shape[0]
                    if r.HasField("error") and r.error.code != 0:
                        self.fail(f"session#{script.index} [{script.desc}] append {i}: error "
                                  f"{r.error.code} {r.error.message}")
                        break
                    if r.length != at:
                        self.fail(f"session#{script.index} append {i}: length {r.length} != {at}")
                        break
                    atol, rtol = solo_tol(script.model, F32)
                    out, w = decode(r.output), decode(r.attn_weights)
                    problem = compare(out, script.outputs[i], atol, rtol) or \
                        compare(w, script.weights[i], atol, rtol)
                    if problem:
                        self.fail(f"session#{script.index} [{script.desc}] append {i} "
                                  f"batch_requests={r.batch_requests}: differs from the solo "
                                  f"session: {problem}")
                        break
                    self.note_diff(f"session {MODELS[script.model]['compute']}-compute",
                                   out, script.outputs[i])
                    self.count(kind, "OK")
        try:
            freed = stub.CloseSession(sessions_pb2.CloseSessionRequest(session_id=sid),
                                      timeout=30.0).freed_bytes
            if freed <= 0:
                self.fail(f"session#{script.index}: CloseSession freed {freed} bytes")
            self.count("session_close", "OK")
        except grpc.RpcError as e:
            self.fail(f"session#{script.index}: CloseSession {e.code().name} ({e.details()})")
        # A closed session and malformed appends: NOT_FOUND / INVALID_ARGUMENT.
        bad = sessions_pb2.AppendRequest()
        bad.CopyFrom(appends[0])
        if rng.random() < 0.5:
            expected, what = SC.NOT_FOUND, "append to a closed session"
        else:
            expected, what = SC.NOT_FOUND, "append to an unknown session"
            bad.session_id = "%032x" % rng.integers(1 << 62)
        try:
            stub.Append(bad, timeout=30.0)
            self.fail(f"session malformed '{what}': answered OK")
        except grpc.RpcError as e:
            self.expect_code("session_malformed", e.code(), (expected,),
                             f"'{what}' ({e.details()})")

    def op_session_malformed(self, rng, stub):
        cases = [
            ("CreateSession unknown model", SC.NOT_FOUND,
             sessions_pb2.CreateSessionRequest(model="nope",
                                               kind=sessions_pb2.SESSION_KIND_SELF)),
            ("CreateSession kind unspecified", SC.INVALID_ARGUMENT,
             sessions_pb2.CreateSessionRequest(model=DEFAULT_MODEL)),
            ("cross CreateSession without key", SC.INVALID_ARGUMENT,
             sessions_pb2.CreateSessionRequest(model="mha_cross_bf16",
                                               kind=sessions_pb2.SESSION_KIND_CROSS)),
        ]
        what, code, req = cases[int(rng.integers(len(cases)))]
        try:
            info = stub.CreateSession(req, timeout=30.0)
            stub.CloseSession(sessions_pb2.CloseSessionRequest(session_id=info.session_id),
                              timeout=30.0)
            self.fail(f"session malformed '{what}': answered OK")
        except grpc.RpcError as e:
            self.expect_code("session_malformed", e.code(), (code,), f"'{what}' ({e.details()})")

    def op_session_bad_append(self, rng, stub):
        """An append of the wrong width to a live session: INVALID_ARGUMENT, session unchanged."""
        e = spec(DEFAULT_MODEL)[0]
        info = stub.CreateSession(sessions_pb2.CreateSessionRequest(
            model=DEFAULT_MODEL, kind=sessions_pb2.SESSION_KIND_SELF), timeout=30.0)
        try:
            bad = sessions_pb2.AppendRequest(session_id=info.session_id)
            bad.tokens.CopyFrom(make_tensor(np.ones((2, e + 1)), F32)[0])
            try:
                stub.Append(bad, timeout=30.0)
                self.fail("session malformed 'append E + 1': answered OK")
            except grpc.RpcError as err:
                self.expect_code("session_malformed", err.code(), (SC.INVALID_ARGUMENT,),
                                 f"'append E + 1' ({err.details()})")
            got = stub.GetSession(sessions_pb2.GetSessionRequest(session_id=info.session_id),
                                  timeout=30.0)
            if got.length != 0:
                self.fail(f"session: a failed append changed the length to {got.length}")
        finally:
            stub.CloseSession(sessions_pb2.CloseSessionRequest(session_id=info.session_id),
                              timeout=30.0)

    def op_misc(self, rng, stub):
        r = rng.random()
        if r < 0.4:
            models = stub.ListModels(attention_pb2.ListModelsRequest(), timeout=30.0)
            if sorted(m.name for m in models.models) != sorted(MODELS):
                self.fail(f"ListModels: {[m.name for m in models.models]}")
            self.count("models", "OK")
        elif r < 0.8:
            name = rng.choice(list(MODELS) + [""])
            info = stub.GetModel(attention_pb2.GetModelRequest(name=name), timeout=30.0)
            if info.name != (name or DEFAULT_MODEL) or info.embed_dim != spec(info.name)[0]:
                self.fail(f"GetModel({name!r}): {info.name} E={info.embed_dim}")
            self.count("models", "OK")
        else:
            try:
                stub.GetModel(attention_pb2.GetModelRequest(name="missing"), timeout=30.0)
                self.fail("GetModel('missing') answered OK")
            except grpc.RpcError as e:
                self.expect_code("models", e.code(), (SC.NOT_FOUND,), "GetModel('missing')")

    OPS = [  # (weight, method, uses the session stub)
        (34, "op_unary", False),
        (16, "op_stream", False),
        (8, "op_malformed", False),
        (6, "op_unary_deadline", False),
        (2, "op_stream_deadline", False),
        (6, "op_unary_cancel", False),
        (4, "op_stream_cancel", False),
        (14, "op_session", True),
        (2, "op_session_malformed", True),
        (2, "op_session_bad_append", True),
        (6, "op_misc", False),
    ]

    def worker(self, wid):
        rng = np.random.default_rng(self.args.seed * 1000 + wid + 1)
        ops = self.args.ops.split(",") if self.args.ops else None
        weights = np.array([w if ops is None or m[3:] in ops else 0 for w, m, _ in self.OPS],
                           float)
        weights /= weights.sum()
        attention_stub, session_stub = self.stubs[wid % len(self.stubs)]
        while time.monotonic() < self.stop_at:
            _, method, session = self.OPS[int(rng.choice(len(self.OPS), p=weights))]
            try:
                getattr(self, method)(rng, session_stub if session else attention_stub)
            except grpc.RpcError as e:
                self.fail(f"{method}: {e.code().name} ({e.details()})")
            except Exception:  # noqa: BLE001 - a bug in the soak itself is a failure too.
                self.fail(f"{method}: {traceback.format_exc()}")

    def run_load(self, seconds, workers):
        self.stop_at = time.monotonic() + seconds
        threads = [threading.Thread(target=self.worker, args=(i,), daemon=True)
                   for i in range(workers)]
        for t in threads:
            t.start()
        return threads


# ----------------------------------------------------------------------------------------------
# Main


def fmt_mib(b):
    return f"{b / 2**20:.1f} MiB"


def reference_phase(stub, session_stub, pool, sessions, weights, failures):
    """Solo results: every pool request alone; each checked against float64."""
    worst = collections.defaultdict(float)
    for entry in pool:
        req = attention_pb2.InferRequest()
        req.CopyFrom(entry.request)
        req.request_id = f"ref{entry.index}"
        try:
            response = stub.Infer(req, timeout=60.0)
        except grpc.RpcError as e:
            failures.append(f"reference pool#{entry.index} [{entry.desc}]: {e.code().name} "
                            f"({e.details()})")
            continue
        if response.batch_requests != 1:
            failures.append(f"reference pool#{entry.index}: batch_requests "
                            f"{response.batch_requests} (not alone)")
        entry.output, entry.weights = decode(response.output), decode(response.attn_weights)
        i = entry.inputs
        out64, w64 = reference_mha(entry.model, weights[entry.model], i["q"], i["k"], i["v"],
                                   i["kpm"], i["am"], entry.request.is_causal,
                                   entry.request.need_weights, entry.request.per_head_weights)
        if not i["batched"]:
            out64 = out64[0]
            w64 = None if w64 is None else w64[0]
        atol, rtol = f64_tol(entry.model, entry.out_dtype)
        for field, got, want in (("output", entry.output, out64),
                                 ("attn_weights", entry.weights, w64)):
            problem = compare(got, want, atol, rtol)
            if problem:
                failures.append(f"reference pool#{entry.index} [{entry.desc}]: solo {field} "
                                f"against float64: {problem}")
        category = f"{MODELS[entry.model]['compute']}-compute, {DTYPE_NAME[entry.out_dtype]} out"
        worst[category] = max(worst[category], max_abs_diff(entry.output, out64),
                              max_abs_diff(entry.weights, w64))
    for script in sessions:
        try:
            want = stub.Infer(script.infer_request, timeout=60.0)
            info = session_stub.CreateSession(script.create, timeout=60.0)
            at = 0
            for c in script.chunks:
                a = sessions_pb2.AppendRequest()
                a.CopyFrom(c)
                a.session_id = info.session_id
                r = session_stub.Append(a, timeout=60.0)
                t = c.tokens.shape[0]
                out = decode(r.output)
                script.outputs.append(out)
                script.weights.append(decode(r.attn_weights))
                atol, rtol = solo_tol(script.model, F32)
                problem = compare(out, decode(want.output)[0, at:at + t], atol * 10, rtol * 10)
                if problem:
                    failures.append(f"reference session#{script.index} [{script.desc}]: rows "
                                    f"{at}:{at + t} differ from the stateless Infer: {problem}")
                worst["session vs Infer, " + MODELS[script.model]["compute"] + "-compute"] = max(
                    worst["session vs Infer, " + MODELS[script.model]["compute"] + "-compute"],
                    max_abs_diff(out, decode(want.output)[0, at:at + t]))
                at += t
            session_stub.CloseSession(sessions_pb2.CloseSessionRequest(
                session_id=info.session_id), timeout=60.0)
        except grpc.RpcError as e:
            failures.append(f"reference session#{script.index} [{script.desc}]: "
                            f"{e.code().name} ({e.details()})")
    return worst


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", required=True, help="the attention-server binary")
    p.add_argument("--duration", type=float, default=60, help="seconds of measured load")
    p.add_argument("--warmup", type=float, default=10,
                   help="seconds of load before the start measurement (not in --duration)")
    p.add_argument("--workers", type=int, default=8, help="concurrent client threads")
    p.add_argument("--pool", type=int, default=300, help="pre-generated valid requests")
    p.add_argument("--sessions", type=int, default=24, help="pre-generated session scripts")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rss_growth_ratio", type=float, default=0.25)
    p.add_argument("--rss_growth_mib", type=float, default=64)
    p.add_argument("--fd_growth", type=int, default=16)
    p.add_argument("--thread_growth", type=int, default=8)
    p.add_argument("--heap_growth_mib", type=float, default=32,
                   help="bound on the growth of the server's malloc'd bytes in use")
    p.add_argument("--no_heap", dest="heap", action="store_false",
                   help="do not measure the heap in use (gdb and malloc_stats())")
    p.add_argument("--server_arg", action="append", default=[],
                   help="an extra attention-server flag (repeatable)")
    p.add_argument("--ops", help="only these operations, comma-separated (unary, stream, "
                   "malformed, unary_deadline, stream_deadline, unary_cancel, stream_cancel, "
                   "session, session_malformed, session_bad_append, misc); default all")
    p.add_argument("--json", help="write the results here as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = p.parse_args()

    started = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="attention-soak-")
    repo_dir = os.path.join(tmp, "models")
    os.makedirs(repo_dir)
    print(f"soak: temporary folder {tmp}", flush=True)
    weights = write_models(repo_dir, args.seed)
    rng = np.random.default_rng(args.seed)
    names = list(MODELS)
    pool = [random_request(rng, i, names[i % len(names)]) for i in range(args.pool)]
    session_models = ["mha_f32", "mha_f16w", "mha_cross_bf16"]
    sessions = [random_session(rng, i, session_models[i % 3]) for i in range(args.sessions)]

    failures = []
    server = Server(args.server, repo_dir, os.path.join(tmp, "server.log"), args.server_arg)
    result = {"duration_s": args.duration, "warmup_s": args.warmup, "workers": args.workers}
    soak = None
    try:
        server.wait_listening(60)
        server.wait_serving(300)
        target = f"127.0.0.1:{server.port}"
        print(f"soak: attention-server pid {server.proc.pid} serving on {target}; "
              f"{len(pool)} requests and {len(sessions)} session scripts in the pool",
              flush=True)
        soak = Soak(args, pool, sessions, target)
        t0 = time.monotonic()
        worst = reference_phase(soak.stubs[0][0], soak.stubs[0][1], pool, sessions, weights,
                                failures)
        print(f"soak: reference phase {time.monotonic() - t0:.1f} s; solo results against "
              f"float64, max |diff|: " + ", ".join(f"{k}: {v:.2g}" for k, v in
                                                   sorted(worst.items())), flush=True)
        result["reference_max_diff"] = dict(worst)
        if failures:
            raise RuntimeError("the reference phase failed")

        threads = soak.run_load(args.warmup, args.workers)
        for t in threads:
            t.join()
        warm = dict(soak.outcomes)
        start = server.resources()
        start["heap"] = server.heap_in_use() if args.heap else None
        print(f"soak: warm-up {args.warmup:.0f} s done ({sum(warm.values())} calls); start: "
              f"RSS {fmt_mib(start['rss'])}, {start['fds']} fds, {start['threads']} threads, "
              f"heap in use {fmt_mib(start['heap']) if start['heap'] else 'n/a'}", flush=True)
        with soak.lock:
            soak.outcomes.clear()
        samples = []
        t_load = time.monotonic()
        threads = soak.run_load(args.duration, args.workers)
        next_report = t_load + min(30.0, args.duration / 4)
        while any(t.is_alive() for t in threads):
            next(t for t in threads if t.is_alive()).join(timeout=1.0)
            if server.proc.poll() is not None:
                soak.fail(f"attention-server exited with {server.proc.returncode} under load")
                soak.stop_at = 0
                break
            now = time.monotonic()
            res = server.resources()
            res["t"] = round(now - t_load, 1)
            samples.append(res)
            if now >= next_report:
                with soak.lock:
                    calls = sum(soak.outcomes.values())
                print(f"soak: t={now - t_load:5.0f} s  {calls} calls  RSS {fmt_mib(res['rss'])}"
                      f"  fds {res['fds']}  threads {res['threads']}  failures "
                      f"{soak.failure_count}", flush=True)
                next_report = now + min(60.0, max(10.0, args.duration / 10))
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t_load
        end = server.resources() if server.proc.poll() is None else None
        if end is not None:
            end["heap"] = server.heap_in_use() if args.heap else None
        result.update(start=start, end=end, elapsed_s=elapsed,
                      peak={k: max(s[k] for s in samples) for k in ("rss", "fds", "threads")}
                      if samples else None, samples=samples)
    except Exception as e:  # noqa: BLE001
        failures.append(f"soak: {e}\n{traceback.format_exc()}")
    finally:
        if soak is not None:
            soak.stop_at = 0
            for c in soak.channels:
                c.close()
        rc = server.stop()

    # Summary ----------------------------------------------------------------------------------
    if soak is not None:
        failures.extend(soak.failures)
        if soak.failure_count > len(soak.failures):
            failures.append(f"... and {soak.failure_count - len(soak.failures)} more failures")
    if rc != 0:
        failures.append(f"attention-server exited with {rc} after SIGTERM (expected 0)")
    bad_log = [line for line in server.lines
               if re.search(r"request failed: (INTERNAL|UNKNOWN|DATA_LOSS)", line)
               or re.search(r"(?i)segmentation|abort|terminate called|sanitizer", line)]
    if bad_log:
        failures.append("server log: " + "; ".join(bad_log[:5]))

    print("\n=== soak summary ===")
    print(f"server: {args.server} (pid {server.proc.pid}), exit code {rc}; log {server.log_path}")
    if soak is not None and "elapsed_s" in result:
        elapsed = result["elapsed_s"]
        by_outcome = collections.Counter()
        by_kind = collections.defaultdict(collections.Counter)
        for (kind, outcome), n in soak.outcomes.items():
            if kind == "all":
                continue
            key = "OK (verified)" if outcome == "OK" else outcome.replace("malformed:", "")
            by_outcome[key] += n
            by_kind[kind][key] += n
        total = sum(by_outcome.values())
        verified = by_outcome["OK (verified)"]
        print(f"load: {elapsed:.1f} s, {args.workers} workers, {total} calls "
              f"({total / elapsed:.0f}/s; verified OK {verified / elapsed:.0f}/s)"
              f" after a {args.warmup:.0f} s warm-up")
        print("by outcome: " + ", ".join(f"{k} {v}" for k, v in by_outcome.most_common()))
        for kind in sorted(by_kind):
            print(f"  {kind:18s} " + ", ".join(f"{k} {v}" for k, v in by_kind[kind].most_common()))
        print("max |batched - solo| seen: " + ", ".join(
            f"{k}: {v:.2g}" for k, v in sorted(soak.max_diff.items())))
        result.update(outcomes=dict(by_outcome), by_kind={k: dict(v) for k, v in by_kind.items()},
                      calls=total, calls_per_s=total / elapsed,
                      max_batched_vs_solo=dict(soak.max_diff))
        start, end = result.get("start"), result.get("end")
        if start and end:
            rss_bound = max(args.rss_growth_ratio * start["rss"], args.rss_growth_mib * 2**20)
            peak = result.get("peak") or end
            print(f"RSS     {fmt_mib(start['rss'])} -> {fmt_mib(end['rss'])} "
                  f"({(end['rss'] - start['rss']) / 2**20:+.1f} MiB; bound "
                  f"+{rss_bound / 2**20:.0f} MiB; peak {fmt_mib(peak['rss'])})")
            print(f"fds     {start['fds']} -> {end['fds']} (bound +{args.fd_growth}; peak "
                  f"{peak['fds']})")
            print(f"threads {start['threads']} -> {end['threads']} (bound +{args.thread_growth};"
                  f" peak {peak['threads']})")
            if end["rss"] - start["rss"] > rss_bound:
                failures.append(f"RSS grew by {(end['rss'] - start['rss']) / 2**20:.1f} MiB "
                                f"(bound {rss_bound / 2**20:.0f} MiB)")
            if end["fds"] - start["fds"] > args.fd_growth:
                failures.append(f"open fds grew by {end['fds'] - start['fds']} "
                                f"(bound {args.fd_growth})")
            if start.get("heap") and end.get("heap"):
                print(f"heap in use {fmt_mib(start['heap'])} -> {fmt_mib(end['heap'])} "
                      f"({(end['heap'] - start['heap']) / 2**20:+.1f} MiB; bound "
                      f"+{args.heap_growth_mib:.0f} MiB)")
                if end["heap"] - start["heap"] > args.heap_growth_mib * 2**20:
                    failures.append(f"heap in use grew by "
                                    f"{(end['heap'] - start['heap']) / 2**20:.1f} MiB (bound "
                                    f"{args.heap_growth_mib:.0f} MiB)")
            else:
                print("heap in use: not measured (gdb unavailable or not permitted)")
            if end["threads"] - start["threads"] > args.thread_growth:
                failures.append(f"threads grew by {end['threads'] - start['threads']} "
                                f"(bound {args.thread_growth})")
    print(f"total time {time.monotonic() - started:.0f} s")
    result["failures"] = failures
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
    if failures:
        print(f"\nFAILED: {len(failures)} problem(s); the first ones:")
        for f in failures[:25]:
            print("  - " + f)
        print("server log tail:\n" + server.tail())
        print(f"(temporary folder kept: {tmp})")
        return 1
    if not args.keep:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
