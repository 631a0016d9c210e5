"""attention_client.export: a torch.nn.MultiheadAttention layer as a model folder attention-server
serves (config.json + model.safetensors, tensors named as the layer's state_dict).

From Python (needs PyTorch: Debian's python3-torch, seen by a venv made with
--system-site-packages, or `pip install torch`):

    import torch
    from attention_client.export import export_mha, export_version
    mha = torch.nn.MultiheadAttention(512, 8, batch_first=True)
    ... train ...
    export_mha(mha, "models/my_mha", extra_config={"max_batch_size": 32})  # models/my_mha/
    export_version(mha, "models", "my_mha")          # models/my_mha/<highest + 1>/, atomically

From the command line, the package's console script (or scripts/export_torch_mha.py from a
checkout, with /usr/bin/python3):

    attention-export --embed_dim 512 --num_heads 8 --out models/my_mha       # a random layer
    attention-export --num_heads 8 --batch_first false \\
        --state_dict trained.pt --out models/my_mha          # a saved state_dict of the layer
    attention-export --state_dict encoder.pt                    # lists the attention layers
    attention-export --state_dict encoder.pt --num_heads 8 --batch_first false \\
        --prefix encoder.layers.3.self_attn. --repository models --model encoder  # models/encoder/N/

The repository layout the server reads (--model_repository DIR; docs/serving-models.md):
DIR/<model>/config.json + model.safetensors (the flat layout: version 1; what --out and
export_mha() write), or numbered version folders DIR/<model>/<version>/config.json +
model.safetensors (what --repository/--model and export_version() write: the next number,
under a hidden temporary name renamed into place, so a server with --model_control=poll picks
it up complete). A model folder holds one layout or the other.

The layout: torch.nn.MultiheadAttention(E, H) and nn.TransformerEncoderLayer default to
batch_first=False, whose forward takes query (L, N, E), key (S, N, kdim), value (S, N, vdim).
config.json records the layer's "batch_first", and the server takes and returns query, key,
value and output in that layout; key_padding_mask (N, S), attn_mask (L, S) or (N*H, L, S) and
the attention weights (N, L, S) are shaped as in PyTorch either way. A module carries
batch_first; a state_dict does not, so exporting one needs --batch_first true|false: how the
code that uses the layer calls it.

A checkpoint of a whole model (a state_dict, a {"state_dict"/"model"/"model_state_dict": ...}
wrapper, or a module saved whole with torch.save): --prefix picks the layer; without it the
attention layers found are listed. embed_dim, kdim, vdim, bias and add_bias_kv are read from
the weights; num_heads and batch_first are not in a state_dict (a saved module carries them).
Errors say what was found and what is missing, without a traceback.

This module imports nothing else of the package (scripts/export_torch_mha.py loads it from a
checkout by its path, without the package's generated gRPC stubs).
"""
import argparse
import importlib.util
import json
import os
import re
import shutil
import struct
import sys
import tempfile

try:
    import torch
except ImportError as e:  # The package itself does not need PyTorch; this module does.
    raise ImportError(
        f"attention_client.export needs PyTorch ({e}): on Debian, apt-get install python3-torch "
        f"and use /usr/bin/python3 or a venv made with --system-site-packages; elsewhere, "
        f"pip install torch") from e

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

    config.json records module.batch_first: the server then takes and returns the tensors as
    the module does, (N, L, E) for batch_first=True and (L, N, E) for False (PyTorch's default).
    dtype: how the weights are stored (float32, bfloat16 or float16).
    compute_dtype: the engine's compute type: float32, bfloat16, or int8 (the projections quantized
        to int8 at load, attention in bfloat16).
    extra_config: more config.json keys, e.g. {"max_batch_size": 32}.
    """
    if not isinstance(module, torch.nn.MultiheadAttention):
        raise TypeError("export_mha expects a torch.nn.MultiheadAttention")
    batch_first = module_batch_first(module)
    given = (extra_config or {}).get("batch_first", batch_first)
    if given != batch_first:
        raise ValueError(f"extra_config batch_first {given!r}, but the module's is {batch_first} "
                         f"(set it on the module: torch.nn.MultiheadAttention(..., "
                         f"batch_first=...))")
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
        "batch_first": batch_first,
        "compute_dtype": compute_dtype,
    }
    config.update(extra_config or {})
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors,
                      metadata={"format": "pt", "source": "torch.nn.MultiheadAttention"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return config


def module_batch_first(module):
    """module.batch_first (modules pickled before PyTorch 1.9 have none: they took (L, N, E))."""
    return bool(getattr(module, "batch_first", False))


def parse_batch_first(text):
    """--batch_first's value: true or false."""
    value = {"true": True, "false": False}.get(str(text).lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")
    return value


# The tensors of one nn.MultiheadAttention, by their state_dict names.
_PACKED = ("in_proj_weight",)
_SEPARATE = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
_OPTIONAL = ("in_proj_bias", "bias_k", "bias_v", "out_proj.bias")


class ExportError(Exception):
    """A checkpoint or a destination this script cannot use; the message says why."""


def _describe(keys, state):
    return ", ".join(f"{k} {list(state[k].shape)}" for k in keys) if keys else "none"


def find_attention_layers(state):
    """{prefix: [keys]} of every attention layer in a state_dict (prefix '' for a bare layer).

    A layer is recognised by its out_proj.weight next to in_proj_weight or q_proj_weight.
    """
    layers = {}
    for key in state:
        for anchor in ("in_proj_weight", "q_proj_weight"):
            if key.endswith(anchor) and (key == anchor or key[-len(anchor) - 1] == "."):
                prefix = key[:-len(anchor)]
                if prefix + "out_proj.weight" in state:
                    layers[prefix] = sorted(k for k in state if k.startswith(prefix) and
                                            _is_layer_key(k[len(prefix):]))
    return dict(sorted(layers.items()))


def _is_layer_key(name):
    return name in _PACKED + _SEPARATE + _OPTIONAL + ("out_proj.weight",)


def _listing(layers, state):
    lines = []
    for prefix, keys in layers.items():
        weight = prefix + "out_proj.weight"
        lines.append(f"  --prefix '{prefix}'  (embed_dim {state[weight].shape[0]}; "
                     f"{len(keys)} tensors: {', '.join(k[len(prefix):] for k in keys)})")
    return "\n".join(lines) if lines else "  (none: no key ends in in_proj_weight or " \
                                          "q_proj_weight beside an out_proj.weight)"


def layer_state_dict(state, prefix):
    """The tensors of the layer under `prefix`, renamed to a bare layer's names."""
    layers = find_attention_layers(state)
    if prefix is None:
        if "" in layers:
            prefix = ""
        else:
            raise ExportError(
                f"the checkpoint holds {len(state)} tensors but is not one attention layer; "
                f"choose a layer with --prefix. Attention layers found:\n{_listing(layers, state)}")
    if prefix and not prefix.endswith("."):
        prefix += "."
    found = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    layer = {k: v for k, v in found.items() if _is_layer_key(k)}
    if not layer:
        raise ExportError(
            f"--prefix '{prefix}' matches no attention tensor ({len(found)} keys start with it). "
            f"Attention layers found:\n{_listing(layers, state)}")
    missing = []
    if "in_proj_weight" not in layer:
        if any(k in layer for k in _SEPARATE):
            missing += [prefix + k for k in _SEPARATE if k not in layer]
        else:
            missing.append(f"{prefix}in_proj_weight (or {prefix}q_proj_weight, k_proj_weight and "
                           f"v_proj_weight)")
    if "out_proj.weight" not in layer:
        missing.append(prefix + "out_proj.weight")
    for pair in (("in_proj_bias", "out_proj.bias"), ("bias_k", "bias_v")):  # Both or neither.
        if any(k in layer for k in pair):
            missing += [prefix + k for k in pair if k not in layer]
    if missing:
        raise ExportError(
            f"--prefix '{prefix}': missing {', '.join(missing)}; found "
            f"{_describe(sorted(prefix + k for k in layer), {prefix + k: v for k, v in layer.items()})}")
    return layer


def config_from_weights(layer):
    """embed_dim, kdim, vdim, bias, add_bias_kv read from a bare layer's tensors."""
    e = layer["out_proj.weight"].shape[0]
    if "in_proj_weight" in layer:
        kdim = vdim = e
    else:
        kdim = layer["k_proj_weight"].shape[1]
        vdim = layer["v_proj_weight"].shape[1]
    return {"embed_dim": e, "kdim": kdim, "vdim": vdim, "bias": "in_proj_bias" in layer,
            "add_bias_kv": "bias_k" in layer}


def module_from_state(layer, num_heads, add_zero_attn=False, batch_first=None):
    """An nn.MultiheadAttention holding `layer` (a bare layer's tensors).

    batch_first: the layout the code using the layer calls it in (required: not in the tensors).
    """
    c = config_from_weights(layer)
    if num_heads is None:
        raise ExportError(f"--num_heads is required: a state_dict does not record it "
                          f"(embed_dim {c['embed_dim']} read from out_proj.weight)")
    if batch_first is None:
        raise ExportError(
            "--batch_first true|false is required: a state_dict does not record the layout the "
            "layer is called in. false: its forward takes query (L, N, E), key (S, N, kdim), "
            "value (S, N, vdim), PyTorch's default for nn.MultiheadAttention and "
            "nn.TransformerEncoderLayer; true: (N, L, E), ... (the layer was built with "
            "batch_first=True). The server takes and returns the tensors in this layout")
    if c["embed_dim"] % num_heads:
        raise ExportError(f"--num_heads {num_heads} does not divide embed_dim {c['embed_dim']}")
    module = torch.nn.MultiheadAttention(c["embed_dim"], num_heads, bias=c["bias"],
                                         add_bias_kv=c["add_bias_kv"],
                                         add_zero_attn=add_zero_attn, kdim=c["kdim"],
                                         vdim=c["vdim"], batch_first=batch_first)
    expected = set(module.state_dict())
    missing = sorted(expected - set(layer))
    unexpected = sorted(set(layer) - expected)
    if missing or unexpected:
        raise ExportError(f"the layer's tensors do not make a MultiheadAttention: missing "
                          f"{', '.join(missing) or 'none'}; unexpected "
                          f"{', '.join(unexpected) or 'none'}; found {_describe(sorted(layer), layer)}")
    for name, t in layer.items():
        want = module.state_dict()[name].shape
        if t.shape != want:
            raise ExportError(f"{name}: shape {list(t.shape)}, expected {list(want)} for embed_dim "
                              f"{c['embed_dim']}, kdim {c['kdim']}, vdim {c['vdim']}")
    module.load_state_dict({k: v.to(torch.float32) for k, v in layer.items()})
    return module.eval()


def module_layer(module, prefix):
    """The nn.MultiheadAttention under `prefix` of a whole saved module."""
    if isinstance(module, torch.nn.MultiheadAttention) and not prefix:
        return module
    layers = {name: m for name, m in module.named_modules()
              if isinstance(m, torch.nn.MultiheadAttention)}
    listing = "\n".join(f"  --prefix '{n}.'  (embed_dim {m.embed_dim}, {m.num_heads} heads)"
                        for n, m in layers.items()) or "  (none)"
    if prefix is None:
        raise ExportError(f"the saved {type(module).__name__} is not one attention layer; choose "
                          f"one with --prefix. nn.MultiheadAttention layers found:\n{listing}")
    name = prefix[:-1] if prefix.endswith(".") else prefix
    if name not in layers:
        raise ExportError(f"--prefix '{prefix}' names no nn.MultiheadAttention in the saved "
                          f"{type(module).__name__}. Layers found:\n{listing}")
    return layers[name]


def load_checkpoint(path, imports=()):
    """torch.load of `path` on the CPU: a module, or a dict of tensors (unwrapped)."""
    for file in imports:  # Classes of whole saved modules, also under __main__.
        spec = importlib.util.spec_from_file_location(
            os.path.splitext(os.path.basename(file))[0], file)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        main = sys.modules["__main__"]
        for k, v in vars(mod).items():
            if not k.startswith("__") and not hasattr(main, k):
                setattr(main, k, v)
    try:
        obj = torch.load(path, map_location="cpu")
    except FileNotFoundError:
        raise ExportError(f"{path}: no such file")
    except (AttributeError, ModuleNotFoundError) as e:
        raise ExportError(f"{path}: a module saved whole needs its class to load ({e}); pass the "
                          f"file defining it with --import, or save model.state_dict() instead")
    except Exception as e:  # pickle and zip errors: not a torch.save file
        raise ExportError(f"{path}: not a torch.save() file ({type(e).__name__}: {e})")
    if isinstance(obj, torch.nn.Module):
        return obj
    if isinstance(obj, dict):
        for wrapper in ("state_dict", "model_state_dict", "model"):
            inner = obj.get(wrapper)
            if isinstance(inner, torch.nn.Module):
                return inner
            if isinstance(inner, dict) and any(torch.is_tensor(v) for v in inner.values()):
                obj = inner
                break
        tensors = {k: v for k, v in obj.items() if torch.is_tensor(v)}
        if tensors:
            return tensors
    raise ExportError(f"{path}: holds a {type(obj).__name__}, neither a module nor a state_dict "
                      f"of tensors")


def next_version_dir(repository, model):
    """(model folder, next version number) of `model` in `repository`."""
    model_dir = os.path.join(repository, model)
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", model) or model.endswith(
            (".tmp", ".part", ".partial")):
        raise ExportError(f"--model '{model}': expected a folder name the server serves "
                          f"(letters, digits, _ . -; not hidden, not ending in .tmp)")
    if os.path.exists(os.path.join(model_dir, "model.safetensors")):
        raise ExportError(f"{model_dir} holds a flat model (model.safetensors directly): move it "
                          f"into {model_dir}/1/ to add versions")
    versions = [int(n) for n in (os.listdir(model_dir) if os.path.isdir(model_dir) else [])
                if re.fullmatch(r"[1-9][0-9]*", n)]
    return model_dir, max(versions, default=0) + 1


def export_version(module, repository, model, version=None, **kwargs):
    """Writes `module` as a new version folder of `model` in `repository`; returns its path.

    The folder is written under a hidden temporary name in the model folder and renamed into
    place, so a server polling the repository never sees it incomplete. version=None: the next
    number after the highest existing one.
    """
    model_dir, number = next_version_dir(repository, model)
    if version is not None:
        number = version
    final = os.path.join(model_dir, str(number))
    if os.path.exists(final):
        raise ExportError(f"{final} exists: versions are immutable, write a new version number")
    os.makedirs(model_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{number}.", suffix=".tmp", dir=model_dir)
    try:
        config = export_mha(module, tmp, force=True, **kwargs)
        os.chmod(tmp, 0o755)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, config


def main(argv=None, prog="attention-export"):
    """The command line (the attention-export console script; scripts/export_torch_mha.py)."""
    layout = __doc__[__doc__.index("The repository layout"):__doc__.index("A checkpoint")].strip()
    p = argparse.ArgumentParser(prog=prog, description="Exports a torch.nn.MultiheadAttention "
                                "layer as a model folder attention-server serves.", epilog=layout,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--embed_dim", type=int, help="new layers; with --state_dict, read from it")
    p.add_argument("--num_heads", type=int, help="required unless a saved module carries it")
    p.add_argument("--kdim", type=int, default=None)
    p.add_argument("--vdim", type=int, default=None)
    p.add_argument("--no_bias", action="store_true")
    p.add_argument("--add_bias_kv", action="store_true")
    p.add_argument("--add_zero_attn", action="store_true")
    p.add_argument("--batch_first", type=parse_batch_first, metavar="true|false",
                   help="the layout the layer is called in: false, PyTorch's default for "
                        "nn.MultiheadAttention and nn.TransformerEncoderLayer, takes query "
                        "(L, N, E), key (S, N, kdim), value (S, N, vdim); true (N, L, E), ... "
                        "Required for a --state_dict of tensors (a saved module carries it; "
                        "it must agree if given); a new layer: default true. Recorded in "
                        "config.json: the server takes and returns tensors in this layout")
    p.add_argument("--seed", type=int, default=0, help="initialisation seed (no --state_dict)")
    p.add_argument("--state_dict", metavar="FILE",
                   help="a torch.save()d state_dict, checkpoint or whole module to export from")
    p.add_argument("--prefix", help="the layer's key prefix in --state_dict, e.g. "
                                    "encoder.layers.3.self_attn. (omit to list the layers)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE.py",
                   help="a Python file defining the classes of a module saved whole")
    p.add_argument("--dtype", default="float32", choices=sorted(_BY_NAME))
    p.add_argument("--compute_dtype", default="float32", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--out", help="model directory to write")
    p.add_argument("--repository", help="a model repository: write --model's next version folder")
    p.add_argument("--model", help="with --repository: the model's folder name")
    p.add_argument("--version", type=int, help="with --repository: this version number")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty --out directory")
    args = p.parse_args(argv)
    if bool(args.out) == bool(args.repository):
        p.error("give either --out DIR or --repository DIR --model NAME")
    if args.repository and not args.model:
        p.error("--repository needs --model NAME")
    try:
        if args.state_dict:
            loaded = load_checkpoint(args.state_dict, args.imports)
            if isinstance(loaded, torch.nn.Module):
                module = module_layer(loaded, args.prefix).eval()
                if (args.batch_first is not None and
                        args.batch_first != module_batch_first(module)):
                    raise ExportError(f"--batch_first {str(args.batch_first).lower()}, but the "
                                      f"saved layer has batch_first="
                                      f"{module_batch_first(module)}")
            else:
                layer = layer_state_dict(loaded, args.prefix)
                module = module_from_state(layer, args.num_heads, args.add_zero_attn,
                                           args.batch_first)
            if args.embed_dim is not None and args.embed_dim != module.embed_dim:
                raise ExportError(f"--embed_dim {args.embed_dim}, but the layer's is "
                                  f"{module.embed_dim}")
            if args.num_heads is not None and args.num_heads != module.num_heads:
                raise ExportError(f"--num_heads {args.num_heads}, but the saved layer has "
                                  f"{module.num_heads}")
        else:
            if args.embed_dim is None or args.num_heads is None:
                raise ExportError("a new layer needs --embed_dim and --num_heads (or export one "
                                  "with --state_dict)")
            torch.manual_seed(args.seed)
            module = torch.nn.MultiheadAttention(
                args.embed_dim, args.num_heads, bias=not args.no_bias,
                add_bias_kv=args.add_bias_kv, add_zero_attn=args.add_zero_attn, kdim=args.kdim,
                vdim=args.vdim, batch_first=True if args.batch_first is None else args.batch_first)
        if args.repository:
            out, config = export_version(module, args.repository, args.model, args.version,
                                         dtype=args.dtype, compute_dtype=args.compute_dtype)
        else:
            out = args.out
            config = export_mha(module, out, args.dtype, args.compute_dtype, force=args.force)
    except (ExportError, FileExistsError, ValueError, TypeError, OSError) as e:
        sys.exit(f"{prog}: {e}")
    print(f"wrote {out}: {json.dumps(config)}")


if __name__ == "__main__":
    main()
