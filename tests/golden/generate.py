#!/usr/bin/env python3
"""Writes the conformance cases in tests/golden/cases/ from PyTorch (seeded, deterministic).

    /usr/bin/python3 tests/golden/generate.py        # rewrites tests/golden/cases/

Each case directory holds a model directory (config.json + model.safetensors, written by
scripts/export_torch_mha.py from a torch.nn.MultiheadAttention), io.safetensors with the inputs
and expected outputs, and case.json with the options and tolerances (see README.md here).

The expected values follow PyTorch 2.x semantics, computed in float64 from the exact weights
and inputs: masks made additive (bool True -> -inf) and summed; is_causal adds the top-left
causal mask over the real keys; add_bias_kv / add_zero_attn append attendable keys; a fully
masked row gets zero weights and a zero context (PyTorch >= 2.5's SDPA path). Where Debian's
PyTorch 1.13 module is well defined (no is_causal, no fully masked row, no float key padding
mask, which 1.13 mishandles), the generator asserts that the module itself agrees with this
reference, so the oracle is PyTorch.
"""
import json
import math
import os
import shutil
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
from export_torch_mha import export_mha, write_safetensors  # noqa: E402

OUT = os.path.join(HERE, "cases")


def additive(mask):
    """Bool (True = masked) -> 0 / -inf; float masks as they are (float64)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=torch.float64).masked_fill(mask, float("-inf"))
    return mask.to(torch.float64)


def reference_mha(m, q, k, v, kpm, am, is_causal):
    """float64 reference of MHA forward, batched inputs (N, L, E). Returns (out, weights)."""
    d = lambda t: None if t is None else t.detach().to(torch.float64)  # noqa: E731
    e, h = m.embed_dim, m.num_heads
    hd = e // h
    n, l, _ = q.shape
    s = k.shape[1]
    if m._qkv_same_embed_dim:
        wq, wk, wv = d(m.in_proj_weight).chunk(3)
    else:
        wq, wk, wv = d(m.q_proj_weight), d(m.k_proj_weight), d(m.v_proj_weight)
    bq = bk = bv = None
    if m.in_proj_bias is not None:
        bq, bk, bv = d(m.in_proj_bias).chunk(3)
    qp = F.linear(d(q), wq, bq)
    kp = F.linear(d(k), wk, bk)
    vp = F.linear(d(v), wv, bv)
    extra = 0
    if m.bias_k is not None:
        kp = torch.cat([kp, d(m.bias_k).expand(n, 1, e)], dim=1)
        vp = torch.cat([vp, d(m.bias_v).expand(n, 1, e)], dim=1)
        extra += 1
    if m.add_zero_attn:
        kp = torch.cat([kp, torch.zeros(n, 1, e, dtype=torch.float64)], dim=1)
        vp = torch.cat([vp, torch.zeros(n, 1, e, dtype=torch.float64)], dim=1)
        extra += 1
    st = s + extra
    mask = torch.zeros(n, h, l, st, dtype=torch.float64)
    if kpm is not None:
        mask[..., :s] += additive(kpm).view(n, 1, 1, s)
    if am is not None:
        a = additive(am)
        mask[..., :s] += a.view(n, h, l, s) if a.dim() == 3 else a.view(1, 1, l, s)
    if is_causal:
        causal = torch.ones(l, s, dtype=torch.bool).triu(1)
        mask[..., :s] = mask[..., :s].masked_fill(causal, float("-inf"))
    qh = qp.view(n, l, h, hd).transpose(1, 2) / math.sqrt(hd)
    kh = kp.view(n, st, h, hd).transpose(1, 2)
    vh = vp.view(n, st, h, hd).transpose(1, 2)
    scores = qh @ kh.transpose(-1, -2) + mask
    full = torch.isneginf(scores).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(full, 0.0), dim=-1).masked_fill(full, 0.0)
    ctx = (probs @ vh).transpose(1, 2).reshape(n, l, e)
    ob = None if m.out_proj.bias is None else d(m.out_proj.bias)
    return F.linear(ctx, d(m.out_proj.weight), ob), probs


def torch_module_output(m, q, k, v, kpm, am, need_weights, average):
    # With grad enabled 1.13 takes its general path (its fast path rejects bias=False).
    with torch.enable_grad():
        out, w = m(q, k, v, key_padding_mask=kpm, attn_mask=am, need_weights=need_weights,
                   average_attn_weights=average)
    return out.detach(), w.detach()


class Case:
    def __init__(self, name, description, e=16, h=2, n=2, l=5, s=None, kdim=None, vdim=None,
                 bias=True, bias_kv=False, zero_attn=False, cross=False, batched=True,
                 kpm=None, am=None, am3d=False, causal=False, weights=None,
                 compute="float32", input_dtype="float32", fully_masked=None, scale=1.0):
        self.__dict__.update(locals())
        del self.__dict__["self"]


def random_mask(kind, shape, g, p=0.3):
    if kind == "bool":
        return torch.rand(shape, generator=g) < p
    return torch.randn(shape, generator=g) * 2.0


def build(case, seed):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    kdim = case.kdim or case.e
    vdim = case.vdim or case.e
    m = torch.nn.MultiheadAttention(case.e, case.h, bias=case.bias, add_bias_kv=case.bias_kv,
                                    add_zero_attn=case.zero_attn, kdim=case.kdim, vdim=case.vdim,
                                    batch_first=True).eval()
    with torch.no_grad():  # Non-zero biases so that they are exercised.
        if m.in_proj_bias is not None:
            m.in_proj_bias.normal_(0, 0.1, generator=g)
            m.out_proj.bias.normal_(0, 0.1, generator=g)
        if m.bias_k is not None:
            m.bias_k.normal_(0, 0.5, generator=g)
            m.bias_v.normal_(0, 0.5, generator=g)
    cross = case.cross or kdim != case.e or vdim != case.e
    s = case.s or case.l
    if not cross:
        s = case.l
    n = case.n
    q = torch.randn(n, case.l, case.e, generator=g) * case.scale
    k = torch.randn(n, s, kdim, generator=g) * case.scale if cross else q
    v = torch.randn(n, s, vdim, generator=g) * case.scale if cross else q
    if case.input_dtype == "bfloat16":
        q = q.to(torch.bfloat16).to(torch.float32)
        if cross:
            k = k.to(torch.bfloat16).to(torch.float32)
            v = v.to(torch.bfloat16).to(torch.float32)
        else:
            k = v = q
    kpm = random_mask(case.kpm, (n, s), g) if case.kpm else None
    am = None
    if case.am:
        am = random_mask(case.am, (n * case.h, case.l, s) if case.am3d else (case.l, s), g)
    if case.fully_masked == "kpm":
        kpm[0, :] = True
    elif case.fully_masked == "attn":
        am[1] = True if am.dim() == 2 else am[1]
        if am.dim() == 3:
            am[:, 1] = True
    return m, q, k, v, kpm, am, cross, s


def check_against_module(case, m, q, k, v, kpm, am, out, probs):
    """Asserts PyTorch 1.13's own module agrees where its behaviour is well defined."""
    if case.causal or case.fully_masked or (kpm is not None and kpm.dtype != torch.bool):
        return False
    if kpm is not None and am is not None and am.dtype != kpm.dtype:
        return False
    if case.compute != "float32":
        return False
    got, w = torch_module_output(m, q, k, v, kpm, am, True, False)
    err = (got.double() - out).abs().max().item()
    werr = (w.double() - probs).abs().max().item()
    assert err < 1e-5 and werr < 1e-5, f"{case.name}: torch module differs by {err}, {werr}"
    return True


def write_case(case, seed):
    m, q, k, v, kpm, am, cross, s = build(case, seed)
    out, probs = reference_mha(m, q, k, v, kpm, am, case.causal)
    verified = check_against_module(case, m, q, k, v, kpm, am, out, probs)
    d = os.path.join(OUT, case.name)
    export_mha(m, d, compute_dtype=case.compute)
    tensors = {}
    squeeze = (lambda t: t[0]) if not case.batched else (lambda t: t)  # noqa: E731
    in_type = torch.bfloat16 if case.input_dtype == "bfloat16" else torch.float32
    tensors["query"] = squeeze(q).to(in_type)
    if cross:
        tensors["key"] = squeeze(k).to(in_type)
        tensors["value"] = squeeze(v).to(in_type)
    if kpm is not None:
        tensors["key_padding_mask"] = squeeze(kpm)
    if am is not None:
        tensors["attn_mask"] = am if (am.dim() == 2 or case.batched) else am[: case.h]
    tensors["expected_output"] = squeeze(out).to(torch.float32)
    if case.weights:
        w = probs.mean(dim=1) if case.weights == "average" else probs
        tensors["expected_attn_weights"] = squeeze(w).to(torch.float32)
    write_safetensors(os.path.join(d, "io.safetensors"), tensors)
    tol = 2e-2 if case.compute == "bfloat16" else None
    meta = {
        "kind": "mha",
        "description": case.description,
        "is_causal": case.causal,
        "need_weights": bool(case.weights),
        "average_attn_weights": case.weights != "per_head",
        "input_dtype": case.input_dtype,
        "compute_dtype": case.compute,
        "atol": tol or 1e-6,
        "rtol": tol or 1e-5,
        "checked_against_torch_module": verified,
    }
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    return verified


def write_sdpa_case(name, description, seed, n=2, h=3, l=5, s=7, dh=8, kpm=None, am=None,
                    am3d=False, causal=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, h, l, dh, generator=g)
    k = torch.randn(n, h, s, dh, generator=g)
    v = torch.randn(n, h, s, dh, generator=g)
    kp = random_mask(kpm, (n, s), g) if kpm else None
    a = random_mask(am, (n * h, l, s) if am3d else (l, s), g) if am else None
    mask = torch.zeros(n, h, l, s, dtype=torch.float64)
    if kp is not None:
        mask += additive(kp).view(n, 1, 1, s)
    if a is not None:
        mask += additive(a).view(n, h, l, s) if a.dim() == 3 else additive(a).view(1, 1, l, s)
    if causal:
        mask = mask.masked_fill(torch.ones(l, s, dtype=torch.bool).triu(1), float("-inf"))
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(dh) + mask
    full = torch.isneginf(scores).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(full, 0.0), -1).masked_fill(full, 0.0)
    out = probs @ v.double()
    if not causal and kp is None and a is not None and a.dtype == torch.float32 and not am3d:
        # PyTorch's own SDPA (1.13's private kernel) agrees where it applies.
        ref = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh) + a, -1) @ v
        assert (ref.double() - out).abs().max() < 1e-5, name
    d = os.path.join(OUT, name)
    os.makedirs(d)
    tensors = {"q": q, "k": k, "v": v, "expected_output": out.to(torch.float32)}
    if kp is not None:
        tensors["key_padding_mask"] = kp
    if a is not None:
        tensors["attn_mask"] = a
    write_safetensors(os.path.join(d, "io.safetensors"), tensors)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump({"kind": "sdpa", "description": description, "is_causal": causal,
                   "atol": 1e-6, "rtol": 1e-5}, f, indent=2, sort_keys=True)
        f.write("\n")


CASES = [
    Case("self_plain", "self-attention, bias, no masks", weights="average"),
    Case("self_no_bias", "bias=False", bias=False, weights="per_head"),
    Case("heads_1", "one head", h=1, e=8, weights="average"),
    Case("heads_4", "four heads, L=9", h=4, e=32, l=9),
    Case("heads_8", "eight heads, E=64", h=8, e=64, l=6, n=3, weights="per_head"),
    Case("cross_same_dims", "cross-attention with kdim == vdim == E, L != S", cross=True, s=8),
    Case("cross_kdim_vdim", "kdim=12, vdim=10 (separate projections), L=4, S=7", kdim=12, vdim=10,
         l=4, s=7, weights="average"),
    Case("cross_kdim_vdim_masks", "kdim/vdim with bool kpm and float 2-D mask", kdim=24, vdim=8,
         l=6, s=5, kpm="bool", am="float"),
    Case("bias_kv", "add_bias_kv", bias_kv=True, weights="per_head"),
    Case("zero_attn", "add_zero_attn", zero_attn=True, weights="average"),
    Case("bias_kv_zero_attn", "add_bias_kv and add_zero_attn with masks", bias_kv=True,
         zero_attn=True, kpm="bool", am="bool", weights="per_head"),
    Case("bias_kv_no_bias", "add_bias_kv with bias=False", bias_kv=True, bias=False),
    Case("unbatched", "unbatched (L, E) input", batched=False, n=1, weights="average"),
    Case("unbatched_masks", "unbatched with (S) kpm and (H, L, S) mask", batched=False, n=1,
         kpm="bool", am="float", am3d=True, weights="per_head"),
    Case("unbatched_cross", "unbatched cross-attention", batched=False, n=1, kdim=12, vdim=10,
         s=6),
    Case("kpm_bool", "bool key_padding_mask", kpm="bool", weights="average"),
    Case("kpm_float", "float key_padding_mask (added)", kpm="float", weights="average"),
    Case("am_bool_2d", "2-D bool attn_mask", am="bool", weights="per_head"),
    Case("am_float_2d", "2-D float attn_mask", am="float"),
    Case("am_bool_3d", "3-D bool attn_mask indexed n*H + h", am="bool", am3d=True, h=4, e=32,
         weights="per_head"),
    Case("am_float_3d", "3-D float attn_mask", am="float", am3d=True, n=3),
    Case("both_bool", "bool kpm and bool attn_mask", kpm="bool", am="bool", weights="average"),
    Case("both_float", "float kpm and float attn_mask summed", kpm="float", am="float"),
    Case("mixed_bool_float", "bool kpm with a float 3-D attn_mask", kpm="bool", am="float",
         am3d=True, weights="per_head"),
    Case("mixed_float_bool", "float kpm with a bool attn_mask", kpm="float", am="bool"),
    Case("causal", "is_causal", causal=True, weights="per_head"),
    Case("causal_kpm", "is_causal with a bool kpm", causal=True, kpm="bool", l=7),
    Case("causal_l_lt_s", "is_causal with L < S (top-left aligned)", causal=True, cross=True,
         l=4, s=7, weights="average"),
    Case("causal_l_gt_s", "is_causal with L > S", causal=True, cross=True, l=8, s=5,
         weights="per_head"),
    Case("causal_bias_kv", "is_causal with add_bias_kv (appended keys stay attendable)",
         causal=True, bias_kv=True, zero_attn=True, weights="per_head"),
    Case("fully_masked_kpm", "an item whose keys are all padding: zero weights, bias output",
         kpm="bool", fully_masked="kpm", weights="per_head"),
    Case("fully_masked_attn", "a query row with every key disallowed", am="bool",
         fully_masked="attn", kpm="bool", weights="average"),
    Case("fully_masked_3d", "fully masked rows in a 3-D mask with need_weights", am="bool",
         am3d=True, fully_masked="attn", weights="per_head"),
    Case("long_rows", "L=S=12, H=4, masks", l=12, h=4, e=32, kpm="bool", am="float",
         weights="average"),
    Case("bf16_compute", "compute_dtype bfloat16", e=32, h=4, compute="bfloat16"),
    Case("bf16_compute_masks", "bfloat16 compute with masks and weights", e=32, h=4,
         compute="bfloat16", kpm="bool", am="float", causal=True, weights="average"),
    Case("bf16_inputs", "bfloat16 inputs, float32 compute", e=32, h=4, input_dtype="bfloat16",
         kpm="bool"),
    Case("bf16_everything", "bfloat16 inputs and compute, cross-attention", e=32, h=4,
         kdim=16, vdim=24, s=6, input_dtype="bfloat16", compute="bfloat16", am="bool"),
]


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    verified = 0
    for i, case in enumerate(CASES):
        verified += write_case(case, 1000 + i)
    sdpa = [
        ("sdpa_plain", "plain SDPA", {}),
        ("sdpa_float_mask", "SDPA with a 2-D float mask", {"am": "float"}),
        ("sdpa_masks_causal", "SDPA with bool kpm, 3-D bool mask and is_causal",
         {"kpm": "bool", "am": "bool", "am3d": True, "causal": True}),
    ]
    for i, (name, desc, kw) in enumerate(sdpa):
        write_sdpa_case(name, desc, 5000 + i, **kw)
    print(f"wrote {len(CASES)} MHA cases ({verified} also checked against torch's own module) "
          f"and {len(sdpa)} SDPA cases to {OUT}")


if __name__ == "__main__":
    main()
