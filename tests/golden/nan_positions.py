#!/usr/bin/env python3
"""Prints where PyTorch puts NaN for NaN (and inf) inputs: core/nan_propagation_test.cc's oracle.

    /usr/bin/python3 tests/golden/nan_positions.py

Each line is one case: a row pattern of the output and of the attention weights (averaged, then
per head), one character per query row: 'N' every value of the row is NaN, 'n' some are, '.' none.
The positions do not depend on the weights or the finite inputs (every projection mixes every
feature), so the C++ test builds the same cases from its own random values and checks the
patterns printed here, which it embeds.

The oracle is torch.nn.MultiheadAttention's forward in eval mode on its general path (grad
enabled, as tests/golden/generate.py calls it), with is_causal given as the equivalent bool mask.
Where 1.13 differs from the project's documented PyTorch 2.x semantics (a float attn_mask with a
bool key_padding_mask: 1.13 overwrites with -inf where 2.x adds), or where the engine differs
from PyTorch on purpose (a row whose every key is -inf-masked: zero weights and context instead
of NaN), the line is marked and the pattern is generate.py's float64 reference, which implements
those semantics. Every other line asserts that the module and the reference agree.

Session cases follow PyTorch fed one token at a time with a key/value cache (query = token p,
keys = tokens 0..p, key_padding_mask = their not-a-key flags): a session row never depends on a
token appended after it, whatever the chunking.
"""
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from generate import reference_mha  # noqa: E402

E, H, L, S = 8, 2, 5, 6
NAN, INF = float("nan"), float("inf")


def pattern(t):
    """(rows, features) -> one character per row."""
    return "".join("N" if torch.isnan(r).all() else "n" if torch.isnan(r).any() else "." for r in t)


def patterns(out, w):
    """out (L, E), w (H, L, S') -> "out avg head0 head1"."""
    return " ".join([pattern(out), pattern(w.mean(0))] + [pattern(h) for h in w])


def module(m, q, k, v, kpm, am):
    with torch.enable_grad():
        out, w = m(q, k, v, key_padding_mask=kpm, attn_mask=am, need_weights=True,
                   average_attn_weights=False)
    return out.detach()[0], w.detach()[0]


def layer(seed):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    with torch.no_grad():
        m.in_proj_bias.normal_(0, 0.1)
        m.out_proj.bias.normal_(0, 0.1)
    return m


def causal_mask(l, s):
    return torch.ones(l, s, dtype=torch.bool).triu(1)


def mha_case(name, q_at=None, k_at=None, v_at=None, cross=False, causal=False, kpm=None,
             am=None, l=L, q_value=NAN, oracle="module"):
    """q/k/v_at: (token, feature) set to q_value / NaN. kpm (S), am (L, S) given as lists."""
    m = layer(7)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, l, E, generator=g)
    k = torch.randn(1, S, E, generator=g) if cross else q
    v = torch.randn(1, S, E, generator=g) if cross else q
    if cross:
        k, v = k.clone(), v.clone()
    if q_at:
        q[0, q_at[0], q_at[1]] = q_value
    if k_at:
        k[0, k_at[0], k_at[1]] = NAN
    if v_at:
        v[0, v_at[0], v_at[1]] = NAN
    s = k.shape[1]
    kpm_t = None if kpm is None else torch.tensor([kpm])
    am_t = None if am is None else torch.tensor(am)
    mask = am_t
    if causal:  # The module has no is_causal in 1.13: the equivalent bool mask.
        mask = causal_mask(l, s) if am_t is None else None
    ref_out, ref_w = reference_mha(m, q, k, v, kpm_t, am_t, causal)
    ref = patterns(ref_out[0], ref_w[0])
    got = patterns(*module(m, q, k, v, kpm_t, mask))
    if oracle == "module":
        assert got == ref, f"{name}: module {got} != reference {ref}"
    note = "" if oracle == "module" else f"  ({oracle}; torch 1.13: {got})"
    print(f"{name:32s} {compress(ref)}{note}")


def compress(p):
    """Long patterns as runs: 'N*300'."""
    words = []
    for word in p.split(" "):
        if len(word) <= 12:
            words.append(word)
            continue
        runs, i = [], 0
        while i < len(word):
            j = i
            while j < len(word) and word[j] == word[i]:
                j += 1
            runs.append(f"{word[i]}*{j - i}")
            i = j
        words.append("+".join(runs))
    return " ".join(words)


def session_case(name, tokens_nan=None, not_key=None, cross=False, causal=False, key_nan=None,
                 kpm=None, q_nan=None):
    """One module call per row p: query = row p, keys = what the session holds for it."""
    m = layer(11)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(1, L, E, generator=g)
    if tokens_nan is not None:
        x[0, tokens_nan, 3] = NAN
    if q_nan is not None:
        x[0, q_nan, 3] = NAN
    key = torch.randn(1, S, E, generator=g)
    value = torch.randn(1, S, E, generator=g)
    if key_nan is not None:
        key[0, key_nan, 1] = NAN
    outs, weights = [], []
    for p in range(L):
        if cross:
            end = min(S, p + 1) if causal else S
            k, v = key[:, :end], value[:, :end]
            mask = None if kpm is None else torch.tensor([kpm[:end]])
        else:
            k = v = x[:, : p + 1]
            mask = None if not_key is None else torch.tensor([not_key[: p + 1]])
        out, w = module(m, x[:, p : p + 1], k, v, mask, None)
        outs.append(out[0])
        weights.append(w[:, 0])  # (H, keys of row p): what the session returns before its zeros.
    out_p = "".join(pattern(o[None]) for o in outs)
    avg_p = "".join(pattern(w.mean(0)[None]) for w in weights)
    head_p = ["".join(pattern(w[h][None]) for w in weights) for h in range(H)]
    print(f"{name:32s} {' '.join([out_p, avg_p] + head_p)}")


def sdpa_case():
    """Plain softmax(q k^T / sqrt(d)) v, (H, L, D): NaN q[0, 2, 1], NaN v[1, 3, 5]."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(H, t, 8, generator=g) for t in (L, S, S))
    q[0, 2, 1] = NAN
    v[1, 3, 5] = NAN
    out = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), -1) @ v
    print(f"{'sdpa_nan_q_and_v':32s} {' '.join(pattern(o) for o in out)}")


def main():
    print(f"# E={E} H={H} L={L} S={S}: out avg head0 head1")
    nan_row = [[0.0] * S for _ in range(L)]
    mha_case("self_nan_token", q_at=(2, 3))
    mha_case("self_nan_token_causal", q_at=(2, 3), causal=True)
    mha_case("cross_nan_query", q_at=(2, 3), cross=True)
    mha_case("cross_inf_query", q_at=(2, 3), cross=True, q_value=INF)
    mha_case("cross_nan_query_causal", q_at=(2, 3), cross=True, causal=True)
    mha_case("cross_nan_key", k_at=(3, 1), cross=True)
    mha_case("cross_nan_key_causal", k_at=(3, 1), cross=True, causal=True)
    mha_case("cross_nan_key_masked", k_at=(3, 1), cross=True, kpm=[j == 3 for j in range(S)])
    mha_case("cross_nan_value_masked", v_at=(3, 5), cross=True, kpm=[j == 3 for j in range(S)])
    mha_case("all_nan_float_kpm", cross=True, kpm=[NAN] * S)
    mha_case("all_nan_float_attn_mask", cross=True, am=[[NAN] * S for _ in range(L)])
    am = [r[:] for r in nan_row]
    am[1][2] = NAN
    mha_case("nan_attn_mask_entry", cross=True, am=am)
    mha_case("nan_kpm_entry", cross=True, kpm=[0.0, 0.0, 0.0, 0.0, NAN, 0.0])
    am = [r[:] for r in nan_row]
    am[1][3] = NAN
    mha_case("nan_attn_mask_under_bool_kpm", cross=True, am=am, kpm=[j == 3 for j in range(S)],
             oracle="2.x mask semantics")
    am = [[0.0 if j == 0 else -INF for j in range(S)] for _ in range(L)]
    am[1] = [-INF] * S
    am[1][2] = NAN
    mha_case("masked_row_with_nan_entry", cross=True, am=am)
    am = [r[:] for r in nan_row]
    am[1] = [-INF] * S
    mha_case("fully_masked_row", cross=True, am=am, oracle="documented zero row")
    mha_case("fully_masked_row_nan_query", q_at=(1, 3), cross=True, am=am)
    mha_case("fully_masked_row_nan_value", v_at=(2, 5), cross=True, am=am,
             oracle="documented zero row")
    mha_case("self_late_nan_token_causal", q_at=(290, 3), causal=True, l=300)
    session_case("session_self_nan_token", tokens_nan=2)
    session_case("session_self_nan_not_key", tokens_nan=2, not_key=[j == 2 for j in range(L)])
    session_case("session_cross_nan_query", q_nan=2, cross=True)
    session_case("session_cross_nan_key_causal", cross=True, causal=True, key_nan=3)
    session_case("session_cross_nan_float_kpm", cross=True, kpm=[NAN] * S)
    sdpa_case()


if __name__ == "__main__":
    main()
