#!/usr/bin/env python3
"""Writes the session conformance cases in tests/golden/sessions/ from PyTorch (seeded).

    /usr/bin/python3 tests/golden/generate_sessions.py   # rewrites tests/golden/sessions/

A session's expected outputs are those of one stateless MultiheadAttention call over the whole
sequence, computed in float64 by generate.py's reference (which the golden suite checks against
torch's own module):

* self sessions: X (T, E) with key_padding_mask = the tokens' "not a key" flags and the causal
  mask, so row p is what appending token p (alone or in any chunk) must return;
* cross sessions: queries (L, E) against fixed key (S, kdim) and value (S, vdim), with an optional
  key_padding_mask (bool or float) and optionally is_causal (query p sees keys j <= p).

Each case holds the model (config.json + model.safetensors), io.safetensors (`tokens`, `not_key`
or `query`, `key`, `value`, `key_padding_mask`; `expected_output`, `expected_attn_weights`
averaged (T, S') and `expected_attn_weights_per_head` (H, T, S')) and case.json.
"""
import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
from export_torch_mha import export_mha, write_safetensors  # noqa: E402
from generate import Case, build, reference_mha  # noqa: E402

OUT = os.path.join(HERE, "sessions")

# T = 37 crosses two 16-token cache blocks.
CASES = [
    Case("self_plain", "self session, bias", l=37, n=1),
    Case("self_no_bias", "bias=False", l=37, n=1, bias=False),
    Case("self_not_key", "bool not-a-key flags (rows whose keys are all masked: zero context)",
         l=37, n=1, kpm="bool"),
    Case("self_bias_kv", "add_bias_kv", l=21, n=1, bias_kv=True),
    Case("self_zero_attn", "add_zero_attn with not-a-key flags", l=21, n=1, zero_attn=True,
         kpm="bool"),
    Case("self_bias_kv_zero_attn", "add_bias_kv and add_zero_attn, bias=False", l=19, n=1,
         bias_kv=True, zero_attn=True, bias=False),
    Case("self_heads_8", "E=64, H=8, T=40", e=64, h=8, l=40, n=1),
    Case("self_bf16", "compute_dtype bfloat16 (cache in bfloat16)", e=32, h=4, l=33, n=1,
         compute="bfloat16", kpm="bool"),
    Case("cross_kdim_vdim", "cross session, kdim=12, vdim=10, bool key_padding_mask", kdim=12,
         vdim=10, l=9, s=20, n=1, kpm="bool"),
    Case("cross_float_kpm", "cross session, float key_padding_mask", cross=True, l=7, s=18, n=1,
         kpm="float"),
    Case("cross_causal", "cross session with is_causal, L > S", cross=True, l=10, s=7, n=1,
         causal=True),
    Case("cross_bias_kv_zero_attn", "cross session with add_bias_kv and add_zero_attn",
         cross=True, l=6, s=17, n=1, bias_kv=True, zero_attn=True),
]


def write(case, seed):
    m, q, k, v, kpm, _, cross, _ = build(case, seed)
    causal = case.causal or not cross
    out, probs = reference_mha(m, q, k, v, kpm, None, causal)
    d = os.path.join(OUT, case.name)
    export_mha(m, d, compute_dtype=case.compute)
    tensors = {}
    if cross:
        tensors.update(query=q[0], key=k[0], value=v[0])
        if kpm is not None:
            tensors["key_padding_mask"] = kpm[0]
    else:
        tensors["tokens"] = q[0]
        if kpm is not None:
            tensors["not_key"] = kpm[0]
    tensors["expected_output"] = out[0].to(torch.float32)
    tensors["expected_attn_weights"] = probs[0].mean(dim=0).to(torch.float32)
    tensors["expected_attn_weights_per_head"] = probs[0].to(torch.float32)
    write_safetensors(os.path.join(d, "io.safetensors"), tensors)
    tol = 2e-2 if case.compute == "bfloat16" else None
    meta = {"kind": "cross" if cross else "self", "description": case.description,
            "is_causal": causal, "compute_dtype": case.compute, "atol": tol or 1e-6,
            "rtol": tol or 1e-5}
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    for i, case in enumerate(CASES):
        write(case, 7000 + i)
    print(f"wrote {len(CASES)} session cases to {OUT}")


if __name__ == "__main__":
    main()
