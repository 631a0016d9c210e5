#!/usr/bin/python3
"""Writes the fuzz targets' seed corpora into tests/fuzz/corpus/<target>/.

Small, valid (and a few nearly valid) inputs that reach past each parser:
model directories (the model_dir_fuzzer format: a 2-byte little-endian
config.json length, config.json, then model.safetensors), attention.v1
InferRequest messages for the fuzz models of infer_request_fuzz.cc, and .npy
files. Deterministic: rerunning rewrites the same bytes.

Usage: /usr/bin/python3 tests/fuzz/make_seeds.py
"""
import json
import os
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


def main():
    for target, seeds in (("model_dir_fuzzer", model_dir_seeds()),
                          ("infer_request_fuzzer", infer_request_seeds()),
                          ("npy_fuzzer", npy_seeds())):
        folder = os.path.join(HERE, "corpus", target)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        for name, data in sorted(seeds.items()):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        print("%s: %d seeds, %d bytes" % (target, len(seeds), sum(map(len, seeds.values()))))


if __name__ == "__main__":
    main()
