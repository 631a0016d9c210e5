#!/usr/bin/python3
"""Writes the fuzz targets' seed corpora into tests/fuzz/corpus/<target>/.

Small, valid (and a few nearly valid) inputs that reach past each parser:
model directories (the model_dir_fuzzer format: a 2-byte little-endian
config.json length, config.json, then model.safetensors), attention.v1
InferRequest messages for the fuzz models of infer_request_fuzz.cc, .npy
files, session fuzz inputs (the decision bytes session_fuzz.cc reads) and
inference.ModelInferRequest inputs for oip_request_fuzz.cc. Also large
inputs into tests/fuzz/slow/<target>/ (too slow to seed fuzzing with; run by
fuzz_regression_test) and issue 21's defects into
tests/fuzz/regressions/<target>/. Deterministic: rerunning rewrites the same
bytes.

Usage: /usr/bin/python3 tests/fuzz/make_seeds.py
"""
import json
import os
import random
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def values(count, scale=0.25):
    return [scale * ((i * 7) % 11 - 5) for i in range(count)]


def encode(dtype, vals):
    if dtype in ("F32", "f32"):
        return struct.pack("<%df" % len(vals), *vals)
    if dtype in ("F16", "f16"):
        return struct.pack("<%de" % len(vals), *vals)
    if dtype in ("BF16", "bf16"):
        return b"".join(struct.pack("<f", v)[2:] for v in vals)
    if dtype in ("BOOL", "bool"):
        return bytes(1 if v > 0 else 0 for v in vals)
    raise ValueError(dtype)


def count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# ---- model directories ------------------------------------------------------


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape)."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        raw = encode(dtype, values(count(shape)))
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def model_dir(config, tensors, metadata=None):
    text = json.dumps(config).encode()
    return struct.pack("<H", len(text)) + text + safetensors(tensors, metadata)


def model_dir_seeds():
    e = 4
    packed = [("in_proj_weight", "F32", [3 * e, e]), ("in_proj_bias", "F32", [3 * e]),
              ("out_proj.weight", "F32", [e, e]), ("out_proj.bias", "F32", [e])]
    return {
        "packed_bias_f32": model_dir({"num_heads": 2, "embed_dim": e}, packed),
        "separate_bias_kv_zero_attn_bf16": model_dir(
            {"num_heads": 2, "kdim": 3, "vdim": 2, "bias": False, "add_bias_kv": True,
             "add_zero_attn": True, "compute_dtype": "bfloat16"},
            [("q_proj_weight", "F16", [e, e]), ("k_proj_weight", "F16", [e, 3]),
             ("v_proj_weight", "F16", [e, 2]), ("out_proj.weight", "F16", [e, e]),
             ("bias_k", "F16", [1, 1, e]), ("bias_v", "F16", [1, 1, e])]),
        "packed_bf16_serving_keys": model_dir(
            {"num_heads": 1, "max_batch_size": 4, "max_batch_tokens": 64,
             "max_queue_delay_us": 0, "max_queue_size": 8, "max_sessions": 2,
             "max_session_tokens": 16, "session_ttl_s": 5, "session_cache_dtype": "bfloat16"},
            [("in_proj_weight", "BF16", [3 * e, e]), ("out_proj.weight", "BF16", [e, e])],
            metadata={"format": "pt"}),
        "config_disagrees": model_dir({"num_heads": 2, "embed_dim": 8, "bias": False}, packed),
        "bool_tensor": model_dir({"num_heads": 2},
                                 [("in_proj_weight", "BOOL", [3 * e, e]),
                                  ("out_proj.weight", "F32", [e, e])]),
    }


# ---- attention.v1.InferRequest ---------------------------------------------

DTYPES = {"f32": 1, "bf16": 2, "f16": 3, "bool": 4}


def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(number, wire_type, payload):
    return varint(number << 3 | wire_type) + payload


def length_delimited(number, raw):
    return field(number, 2, varint(len(raw)) + raw)


def tensor(dtype, shape, vals=None):
    vals = values(count(shape)) if vals is None else vals
    packed_shape = b"".join(varint(d) for d in shape)
    return (field(1, 0, varint(DTYPES[dtype])) + length_delimited(2, packed_shape) +
            length_delimited(3, encode(dtype, vals)))


def request(model="", request_id="", query=None, key=None, value=None, key_padding_mask=None,
            attn_mask=None, is_causal=False, need_weights=False, per_head_weights=False,
            output_dtype=None):
    out = b""
    if model:
        out += length_delimited(1, model.encode())
    if request_id:
        out += length_delimited(2, request_id.encode())
    for number, t in ((3, query), (4, key), (5, value), (6, key_padding_mask), (7, attn_mask)):
        if t is not None:
            out += length_delimited(number, tensor(*t))
    for number, flag in ((8, is_causal), (9, need_weights), (10, per_head_weights)):
        if flag:
            out += field(number, 0, varint(1))
    if output_dtype:
        out += field(11, 0, varint(DTYPES[output_dtype]))
    return out


def infer_request_seeds():
    e = 8
    return {
        "self_weights": request(query=("f32", [1, 3, e]), need_weights=True, request_id="a"),
        "unbatched_masks_f16": request(
            model="self", query=("f16", [4, e]), key_padding_mask=("bool", [4]),
            attn_mask=("f32", [4, 4]), output_dtype="bf16", need_weights=True),
        "batched_3d_mask_per_head": request(
            query=("f32", [2, 3, e]), key_padding_mask=("bool", [2, 3]),
            attn_mask=("bool", [4, 3, 3]), need_weights=True, per_head_weights=True),
        "cross_kv": request(
            model="cross", query=("f32", [1, 2, e]), key=("f32", [1, 3, 6]),
            value=("bf16", [1, 3, 4]), key_padding_mask=("f32", [1, 3]), need_weights=True),
        "causal_bf16": request(query=("bf16", [1, 5, e]), is_causal=True, output_dtype="f16"),
        "wrong_embed_dim": request(query=("f32", [1, 2, 6])),
        "unknown_model": request(model="nope", query=("f32", [1, 1, e])),
    }


# ---- session_fuzzer ---------------------------------------------------------
# The byte stream session_fuzz.cc reads (tests/fuzz/fuzz_input.h): one byte
# per decision. Range(lo, hi) reads v - lo; Percent(p) is true for 0 and
# false for 99; Value(v) is round(32 v) as int8.

YES, NO = 0, 99


def value_bytes(vals):
    return bytes(int(round(v * 32)) & 0xFF for v in vals)


def spec_bytes(heads, head_dim, kdim=None, vdim=None, bias=True, bias_kv=False, zero_attn=False,
               bf16=False, seed=0):
    out = bytes([heads - 1, head_dim - 1])
    out += bytes([YES]) if kdim is None else bytes([NO, kdim - 1])
    out += bytes([YES]) if vdim is None else bytes([NO, vdim - 1])
    flags = (0 if bias else 1) | (2 if bias_kv else 0) | (4 if zero_attn else 0) | (
        8 if bf16 else 0) | seed << 4
    return out + bytes([flags])


DT = {"f32": 0, "bf16": 1, "f16": 2}


MAX_READ_VALUES = 512  # session_fuzz.cc's kMaxReadValues: later values follow a pattern.


def cross_bytes(kdim, vdim, keys, causal=False, mask=None, large=False):
    """mask: None, 'bool', 'f32', 'bf16' or 'f16' (every fourth key masked);
    large: 2048 to 16384 keys (else 1 to 20)."""
    out = bytes([YES, 1 if causal else 0, YES if large else NO])
    out += struct.pack(">H", keys - 2048) if large else bytes([keys - 1])
    out += bytes([NO, DT["f32"]])
    out += value_bytes(values(min(keys * kdim, MAX_READ_VALUES)))
    out += bytes([DT["bf16"]]) + value_bytes(values(min(keys * vdim, MAX_READ_VALUES), 0.5))
    kinds = [None, "bool", "f32", "bf16", "f16"]
    out += bytes([kinds.index(mask)])
    for j in range(min(keys, MAX_READ_VALUES) if mask else 0):
        if mask == "bool":
            out += bytes([YES if j % 4 == 3 else NO])
        else:
            out += bytes([YES]) if j % 4 == 3 else bytes([NO]) + value_bytes([0.25 * (j % 3)])
    return out


def step_bytes(t, e, cross=False, not_key=None, weights=None, dtype="f32", offset=0):
    """weights: None, 'avg' or 'heads'; not_key: list of bools (self)."""
    out = bytes([t - 1, NO]) + value_bytes(values(t * e + offset)[offset:]) + bytes([DT[dtype]])
    if not_key is None:
        out += bytes([NO])
    else:
        out += bytes([YES]) + bytes(YES if f else NO for f in not_key)
    out += bytes([YES if weights else NO, 1 if weights == "avg" else 0])
    return out


def round_bytes(chosen, steps, commit_in_run=True, keep=None):
    """keep: per step, when not committed by Run (True: commit, False: drop)."""
    out = bytes([chosen, 1 if commit_in_run else 0]) + b"".join(steps)
    if not commit_in_run:
        out += bytes(YES if k else NO for k in keep)
    return out


def session_setup(sessions=1, bf16_cache=False, no_memory=False):
    return bytes([(1 if bf16_cache else 0) | (sessions - 1) << 1 | (0xF0 if no_memory else 0)])


def session_seeds():
    e = 8
    self_ = bytes([NO])  # Percent(40) for "cross": false.
    return {
        "self_chunks_f32": spec_bytes(2, 4) + session_setup() + self_ + b"".join(
            round_bytes(1, [step_bytes(t, e, weights=w, offset=t)])
            for t, w in ((5, "avg"), (1, None), (3, "heads"), (1, "avg"), (7, "heads"))),
        "self_not_key_bias_kv_zero_attn": spec_bytes(2, 3, bias_kv=True, zero_attn=True) +
        session_setup() + self_ + b"".join(
            round_bytes(1, [step_bytes(t, 6, not_key=nk, weights="heads", dtype="bf16")])
            for t, nk in ((3, [True, False, True]), (2, None), (1, [True]), (4, [False] * 4))),
        "cross_causal_bool_mask": spec_bytes(2, 4, kdim=6, vdim=5) + session_setup() +
        cross_bytes(6, 5, 9, causal=True, mask="bool") + b"".join(
            round_bytes(1, [step_bytes(t, e, cross=True, weights="avg")]) for t in (4, 1, 6)),
        "cross_float_mask_bf16": spec_bytes(1, 4, bias=False) + session_setup() +
        cross_bytes(4, 4, 5, mask="bf16") + round_bytes(1, [step_bytes(3, 4, cross=True)]),
        "bf16_compute_bf16_cache": spec_bytes(4, 2, bf16=True, zero_attn=True) +
        session_setup(bf16_cache=True) + self_ + b"".join(
            round_bytes(1, [step_bytes(t, e, weights="avg", dtype="f16")]) for t in (6, 2, 9)),
        "three_sessions_pipelined": spec_bytes(2, 4) + session_setup(sessions=3) + self_ + self_ +
        cross_bytes(8, 8, 7, mask="f32") + b"".join(
            round_bytes(7, [step_bytes(t, e, weights="heads"),
                            step_bytes(t + 2, e, not_key=[i % 2 == 0 for i in range(t + 2)],
                                       weights="avg", offset=3),
                            step_bytes(t, e, cross=True, weights="avg")],
                        commit_in_run=(t != 2), keep=[True, False, True])
            for t in (3, 2, 1, 4)),
        "no_session_memory": spec_bytes(1, 2) + session_setup(no_memory=True) + self_ +
        round_bytes(1, [step_bytes(2, 2)]),
    }


def session_slow():
    """Large inputs: each computes for about a second in the fuzzers' build."""
    return {
        # Per-head weights past the working estimates' fixed 4 MiB allowance.
        "large_cross_per_head_weights": spec_bytes(4, 2) + session_setup() +
        cross_bytes(8, 8, 6000, mask="bool", large=True) + b"".join(
            round_bytes(1, [step_bytes(t, 8, cross=True, weights=w)])
            for t, w in ((48, "avg"), (40, "heads"))),
    }


def session_regressions():
    """Issue 21's defects as session fuzz inputs (each fails before its fix)."""
    return {
        # Item 1: a self session on a model with kdim, vdim != embed_dim.
        "issue21_self_session_kdim_vdim": spec_bytes(2, 4, kdim=5, vdim=7) + session_setup() +
        bytes([NO]) + round_bytes(1, [step_bytes(5, 8)]),
        # Item 8: a cross session's float16 key_padding_mask (Infer takes one).
        "issue21_cross_f16_key_padding_mask": spec_bytes(1, 4, bias=False) + session_setup() +
        cross_bytes(4, 4, 5, mask="f16") + round_bytes(1, [step_bytes(3, 4, cross=True)]),
    }


# ---- oip_request_fuzzer -------------------------------------------------------
# An input's first byte picks the form: even, length-prefixed ModelInferRequest
# messages ((byte >> 1) % 5 + 1 of them); odd, generated from the bytes.


def infer_parameter(kind, v):
    if kind == "bool":
        return field(1, 0, varint(1 if v else 0))
    if kind == "int64":
        return field(2, 0, varint(v))
    if kind == "string":
        return length_delimited(3, v.encode())
    if kind == "uint64":
        return field(5, 0, varint(v))
    raise ValueError(kind)


OIP_TYPES = {"FP32": "f32", "FP16": "f16", "BF16": "bf16", "BOOL": "bool"}


def oip_input(name, datatype, shape):
    packed_shape = b"".join(varint(d) for d in shape)
    return (length_delimited(1, name.encode()) + length_delimited(2, datatype.encode()) +
            length_delimited(3, packed_shape))


def model_infer(model="", request_id="", inputs=(), params=(), outputs=(), typed=False):
    """inputs: (name, datatype, shape); params: (name, kind, value)."""
    out = b""
    if model:
        out += length_delimited(1, model.encode())
    if request_id:
        out += length_delimited(3, request_id.encode())
    for name, kind, v in params:
        entry = length_delimited(1, name.encode()) + length_delimited(2, infer_parameter(kind, v))
        out += length_delimited(4, entry)
    raw = b""
    for name, datatype, shape in inputs:
        vals = values(count(shape))
        tensor_msg = oip_input(name, datatype, shape)
        if typed:
            contents = (length_delimited(1, bytes(1 if v > 0 else 0 for v in vals))
                        if datatype == "BOOL" else
                        length_delimited(6, struct.pack("<%df" % len(vals), *vals)))
            tensor_msg += length_delimited(5, contents)
        else:
            raw += length_delimited(7, encode(OIP_TYPES[datatype], vals))
        out += length_delimited(5, tensor_msg)
    for name in outputs:
        out += length_delimited(6, length_delimited(1, name.encode()))
    return out + raw


def oip_parsed(*requests, roomy=False):
    """roomy: to the server with large limits (else the tight one)."""
    assert 1 <= len(requests) <= 5
    out = bytes([(len(requests) - 1) << 1 | (0x80 if roomy else 0)])
    for r in requests:
        out += struct.pack("<H", len(r)) + r
    return out


# The generated form (oip_request_gen.cc's Generate), for the few requests
# the seeds need: one byte per decision, in the order Generate reads them.
# Values past the first 512 of a tensor follow a pattern (no bytes).


def generated_input(dtype_index, count):
    """AddInput of a raw tensor: no perturbation, then its values."""
    return bytes([NO, NO, NO, NO, NO]) + value_bytes(values(min(count, MAX_READ_VALUES)))


def generated_request(pick=1, same=False, sequence=None, weights=None, t=4, keys=None,
                      shared=False):
    """pick: 0 "" (default), 1 self, 2 cross, 3 wide, 4 half; same: the
    shared sequence's next step; sequence: "start" a string id "a" (the
    plan's first); weights: None, "avg" or "heads"; keys: key rows (models
    with kdim != E need them); t: query tokens, > 64 only for the roomy
    server; shared: the input's requests are one sequence. Batch of one, BF16
    raw contents, default outputs."""
    e, kdim, vdim = {1: (8, 8, 8), 2: (8, 6, 4), 3: (8, 16, 16), 4: (12, 12, 12)}[pick or 1]
    out = bytes([NO]) if same else bytes([pick])  # Percent(5) "not the same", or the model.
    out += bytes([NO, NO, NO])  # model_version, id, long id.
    if same:
        out += bytes([NO, NO])  # sequence_start, sequence_end.
    elif sequence == "start":
        out += b"" if shared else bytes([YES])  # A sequence (always, when shared).
        out += bytes([0, 0, NO, NO])  # string id "a"; start (first of its id); no end.
    else:
        assert not shared
        out += bytes([NO])  # No sequence.
    for flag in ("need", "avg"):
        if weights is None:
            out += bytes([NO])
        else:
            out += bytes([YES, NO, 1 if flag == "need" or weights == "avg" else 0])
    out += bytes([NO, NO, NO, NO])  # is_causal, timeout, priority, binary_data_output.
    out += bytes([0])  # Layout: [1, T, E].
    if t > 64:
        out += bytes([YES]) + struct.pack(">H", t - 65)
    elif t > 16:
        out += bytes([NO, YES, t - 17])
    else:
        out += bytes([NO, NO, t - 1])
    out += bytes([NO, 2])  # Raw contents, BF16.
    out += generated_input(2, t * e)
    cross = kdim != e or vdim != e
    if keys is None:
        out += bytes([YES if cross else NO])  # !Percent(20) or Percent(15): no keys.
    else:
        out += bytes([NO if cross else YES])
        out += bytes([YES]) + struct.pack(">H", keys - 17) if keys > 16 else bytes([NO, keys - 1])
        out += bytes([2]) + generated_input(2, keys * kdim)
        out += bytes([NO, 2]) + generated_input(2, keys * vdim)
    return out + bytes([NO, NO, 0])  # No key_padding_mask, no attn_mask, default outputs.


def oip_generated(requests, roomy=False, shared=False):
    """shared: the requests are one sequence (SequencePlan::shared)."""
    assert 1 <= len(requests) <= 5
    out = bytes([1 | (len(requests) - 1) << 1 | (0x80 if roomy else 0), 1 if shared else 0])
    return out + b"".join(requests)


def oip_seeds():
    e = 8
    seq = lambda sid, *extra: [("sequence_id", "string", sid)] + list(extra)
    start = ("sequence_start", "bool", True)
    end = ("sequence_end", "bool", True)
    weights = ("need_weights", "bool", True)
    per_head = ("average_attn_weights", "bool", False)
    seeds = {
        "stateless_self_weights": oip_parsed(model_infer(
            request_id="r1", inputs=[("query", "FP32", [1, 3, e])], params=[weights])),
        "stateless_cross_masks_typed": oip_parsed(model_infer(
            model="cross", typed=True,
            inputs=[("query", "FP32", [1, 2, e]), ("key", "FP32", [1, 3, 6]),
                    ("value", "FP32", [1, 3, 4]), ("key_padding_mask", "BOOL", [1, 3])],
            outputs=["attn_weights", "output"])),
        "stateless_half_causal_f16": oip_parsed(model_infer(
            model="half", inputs=[("query", "FP16", [4, 12])],
            params=[("is_causal", "bool", True), weights, per_head])),
        "sequence_start_step_end": oip_parsed(
            model_infer(inputs=[("query", "FP32", [1, 5, e])], params=seq("a", start)),
            model_infer(inputs=[("query", "BF16", [1, 2, e])], params=seq("a", weights)),
            model_infer(inputs=[("query", "FP32", [3, e])], params=seq("a", end, weights,
                                                                       per_head))),
        "two_sequences_numeric_ids": oip_parsed(
            model_infer(model="half", inputs=[("query", "FP32", [1, 4, 12])],
                        params=[("sequence_id", "uint64", 7), start]),
            model_infer(model="self", inputs=[("query", "FP32", [1, 2, e])],
                        params=[("sequence_id", "int64", 7), start]),
            model_infer(model="half", inputs=[("query", "FP32", [1, 1, 12])],
                        params=[("sequence_id", "uint64", 7), weights])),
        "sequence_without_start": oip_parsed(model_infer(
            inputs=[("query", "FP32", [1, 2, e])], params=seq("zz"))),
        "unknown_model_and_input": oip_parsed(
            model_infer(model="nope", inputs=[("query", "FP32", [1, 1, e])]),
            model_infer(inputs=[("logits", "FP32", [1, 1, e])])),
    }
    # Generated requests: bytes from a fixed generator.
    rng = random.Random(21)
    for i in range(4):
        seeds["generated_%d" % i] = bytes([1 | (i % 5) << 1]) + bytes(
            rng.randrange(256) for _ in range(600))
    return seeds


# ---- .npy ------------------------------------------------------------------


def npy(descr, shape, raw, version=1, fortran=False):
    shape_text = "(" + "".join("%d, " % d for d in shape).rstrip(" ")
    if len(shape) > 1:
        shape_text = shape_text.rstrip(",")
    shape_text += ")"
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
        descr, "True" if fortran else "False", shape_text)
    prefix = 10 if version == 1 else 12
    header += " " * ((-(prefix + len(header) + 1)) % 64) + "\n"
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode("latin1") + raw


def npy_seeds():
    return {
        "f4_2x3": npy("<f4", [2, 3], encode("f32", values(6))),
        "f2_4": npy("<f2", [4], encode("f16", values(4))),
        "b1_2x2": npy("|b1", [2, 2], bytes([0, 1, 1, 0])),
        "u2_bfloat16_3": npy("<u2", [3], encode("bf16", values(3))),
        "f8_2": npy("<f8", [2], struct.pack("<2d", 1.5, -2.25)),
        "scalar": npy("<f4", [], encode("f32", [3.0])),
        "empty_0x3": npy("<f4", [0, 3], b""),
        "v2_header": npy("<f4", [2], encode("f32", values(2)), version=2),
        "fortran": npy("<f4", [2, 2], encode("f32", values(4)), fortran=True),
    }


def oip_slow():
    """Large inputs: each computes for about a second in the fuzzers' build."""
    seeds = {}
    # Generated for the roomy server, large enough that the per-head weights
    # (4 to 6 MB) pass the working estimates' fixed 4 MiB allowance.
    seeds["roomy_cross_per_head_weights"] = oip_generated(
        [generated_request(pick=2, weights="heads", t=512, keys=1024)], roomy=True)
    seeds["roomy_long_sequence"] = oip_generated(
        [generated_request(pick=1, sequence="start", t=512, shared=True),
         generated_request(same=True, t=512),
         generated_request(same=True, weights="heads", t=512)], roomy=True, shared=True)
    return seeds


def oip_regressions():
    """Issue 21's defects as OIP fuzz inputs (each fails before its fix)."""
    e = 8
    start = ("sequence_start", "bool", True)
    return {
        # Item 1: one sequence_start on a model whose kdim, vdim != embed_dim.
        "issue21_sequence_on_kdim_vdim_model": oip_parsed(model_infer(
            model="cross", inputs=[("query", "FP32", [1, 5, e])],
            params=[("sequence_id", "string", "a"), start])),
        # Item 2: a step queued behind a prefill is estimated at length 0,
        # computed, committed, then refused by the encoder.
        "issue21_pipelined_step_applied_and_refused": oip_parsed(
            model_infer(inputs=[("query", "FP32", [1, 48, e])],
                        params=[("sequence_id", "string", "a"), start]),
            model_infer(inputs=[("query", "FP32", [1, 16, e])],
                        params=[("sequence_id", "string", "a"), ("need_weights", "bool", True),
                                ("average_attn_weights", "bool", False)])),
    }


def main():
    for kind, target, seeds in (("corpus", "model_dir_fuzzer", model_dir_seeds()),
                                ("corpus", "infer_request_fuzzer", infer_request_seeds()),
                                ("corpus", "npy_fuzzer", npy_seeds()),
                                ("corpus", "session_fuzzer", session_seeds()),
                                ("corpus", "oip_request_fuzzer", oip_seeds()),
                                ("slow", "session_fuzzer", session_slow()),
                                ("slow", "oip_request_fuzzer", oip_slow())):
        folder = os.path.join(HERE, kind, target)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        for name, data in sorted(seeds.items()):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        print("%s/%s: %d inputs, %d bytes" % (kind, target, len(seeds),
                                             sum(map(len, seeds.values()))))
    # Inputs of known defects beside the ones fuzzers found (never removed here).
    for target, inputs in (("session_fuzzer", session_regressions()),
                           ("oip_request_fuzzer", oip_regressions())):
        folder = os.path.join(HERE, "regressions", target)
        os.makedirs(folder, exist_ok=True)
        for name, data in sorted(inputs.items()):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
