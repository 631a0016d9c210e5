#!/usr/bin/env python3
"""Exports a torch.nn.MultiheadAttention layer as a model directory attention-server serves.

A model directory holds config.json and model.safetensors whose tensor names are exactly the
layer's state_dict names (in_proj_weight or q/k/v_proj_weight, in_proj_bias, out_proj.weight,
out_proj.bias, bias_k, bias_v).

From Python (Debian's /usr/bin/python3 with python3-torch):

    import torch
    from export_torch_mha import export_mha
    mha = torch.nn.MultiheadAttention(512, 8, batch_first=True)
    ... train ...
    export_mha(mha, "models/my_mha", extra_config={"max_batch_size": 32})

From the command line:

    /usr/bin/python3 scripts/export_torch_mha.py --embed_dim 512 --num_heads 8 --out models/my_mha
    /usr/bin/python3 scripts/export_torch_mha.py --embed_dim 512 --num_heads 8 \\
        --state_dict trained.pt --out models/my_mha          # a saved state_dict of the layer
    build/bin/attention-server --model_repository models
"""
import argparse
import json
import os
import struct
import sys

import torch

_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.bool: "BOOL"}
_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: take the raw 16-bit words.
        return t.view(torch.int16).numpy().tobytes()
    if t.dtype == torch.bool:
        return t.to(torch.uint8).numpy().tobytes()
    return t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: torch.Tensor} as a safetensors file (F32, BF16, F16 or BOOL)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        if t.dtype not in _DTYPES:
            raise ValueError(f"tensor '{name}': unsupported dtype {t.dtype}")
        data = _tensor_bytes(t)
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (8 + len(text)) % 8) % 8)  # Data starts 8-byte aligned.
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for data in blobs:
            f.write(data)


def export_mha(module, out_dir, dtype="float32", compute_dtype="float32", extra_config=None,
               force=False):
    """Writes out_dir/config.json and out_dir/model.safetensors for `module`.

    dtype: how the weights are stored (float32, bfloat16 or float16).
    compute_dtype: the engine's compute type: float32, bfloat16, or int8 (the projections quantized
        to int8 at load, attention in bfloat16).
    extra_config: more config.json keys, e.g. {"max_batch_size": 32}.
    """
    if not isinstance(module, torch.nn.MultiheadAttention):
        raise TypeError("export_mha expects a torch.nn.MultiheadAttention")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not force:
        raise FileExistsError(f"{out_dir} exists and is not empty (use force=True / --force)")
    os.makedirs(out_dir, exist_ok=True)
    store = _BY_NAME[dtype]
    tensors = {name: t.detach().to(store) for name, t in module.state_dict().items()}
    config = {
        "num_heads": module.num_heads,
        "embed_dim": module.embed_dim,
        "kdim": module.kdim,
        "vdim": module.vdim,
        "bias": module.in_proj_bias is not None,
        "add_bias_kv": module.bias_k is not None,
        "add_zero_attn": bool(module.add_zero_attn),
        "compute_dtype": compute_dtype,
    }
    config.update(extra_config or {})
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors,
                      metadata={"format": "pt", "source": "torch.nn.MultiheadAttention"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return config


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--embed_dim", type=int, required=True)
    p.add_argument("--num_heads", type=int, required=True)
    p.add_argument("--kdim", type=int, default=None)
    p.add_argument("--vdim", type=int, default=None)
    p.add_argument("--no_bias", action="store_true")
    p.add_argument("--add_bias_kv", action="store_true")
    p.add_argument("--add_zero_attn", action="store_true")
    p.add_argument("--seed", type=int, default=0, help="initialisation seed (no --state_dict)")
    p.add_argument("--state_dict", help="a torch.save()d state_dict of the layer to export")
    p.add_argument("--dtype", default="float32", choices=sorted(_BY_NAME))
    p.add_argument("--compute_dtype", default="float32", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty directory")
    args = p.parse_args()
    torch.manual_seed(args.seed)
    module = torch.nn.MultiheadAttention(args.embed_dim, args.num_heads, bias=not args.no_bias,
                                         add_bias_kv=args.add_bias_kv,
                                         add_zero_attn=args.add_zero_attn, kdim=args.kdim,
                                         vdim=args.vdim, batch_first=True)
    if args.state_dict:
        module.load_state_dict(torch.load(args.state_dict, map_location="cpu"))
    try:
        config = export_mha(module, args.out, args.dtype, args.compute_dtype, force=args.force)
    except (FileExistsError, ValueError) as e:
        sys.exit(f"export_torch_mha: {e}")
    print(f"wrote {args.out}: {json.dumps(config)}")


if __name__ == "__main__":
    main()
