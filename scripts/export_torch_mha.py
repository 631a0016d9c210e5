#!/usr/bin/env python3
"""Exports a torch.nn.MultiheadAttention layer as a model folder attention-server serves: the
Python package's exporter (client/python/attention_client/export.py, installed as the
`attention-export` console script and `attention_client.export`), run from a checkout with
Debian's PyTorch and without installing the package:

    /usr/bin/python3 scripts/export_torch_mha.py --embed_dim 512 --num_heads 8 --out models/my_mha
    /usr/bin/python3 scripts/export_torch_mha.py --help       # every flag, the folder layout

Its functions (export_mha, export_version, write_safetensors, ...) are importable from here
too, with scripts/ on sys.path (the repository's tests and benchmarks do that); code outside
the repository imports attention_client.export from the installed package instead.
"""
import importlib.util
import os
import sys

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python",
                       "attention_client", "export.py")
# Loaded by its path, not as attention_client.export: importing the package needs its
# generated gRPC stubs, which a checkout has only after a build; the exporter needs none.
_spec = importlib.util.spec_from_file_location("_attention_client_export", _SOURCE)
_module = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _module
_spec.loader.exec_module(_module)
globals().update({name: value for name, value in vars(_module).items()
                  if not name.startswith("__")})

if __name__ == "__main__":
    _module.main(prog="export_torch_mha")
