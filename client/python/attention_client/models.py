"""Models, their versions and model control: the typed results of AttentionClient's models(),
repository_index(), load_model() and unload_model() (and InferenceClient's Triton-named
get_model_repository_index(), load_model(), unload_model()).

    from attention_client import AttentionClient
    client = AttentionClient("localhost:50051")
    for m in client.models():                 # dicts, as ModelInfo: name, version, versions...
        print(m["name"], m["version"], [(v["version"], v["state"]) for v in m["versions"]])
    for entry in client.repository_index():   # every model folder, served or not
        print(entry.name, entry.version, entry.state, entry.reason)
    client.load_model("encoder")               # -> [2, 3]: the versions serving after it
    client.unload_model("encoder")

Loading and unloading need a server run with --model_control=explicit (FAILED_PRECONDITION
otherwise) and, with tokens, the admin permission (PERMISSION_DENIED otherwise); both raise
AttentionError with the server's message. The repository index comes from the Open
Inference Protocol's RepositoryIndex on the same channel. Stateless: safe from any thread.
"""
from dataclasses import dataclass
from typing import Any, Dict, List

from ._stubs import attention_pb2
from ._stubs import grpc_predict_v2_pb2 as oip


@dataclass
class ModelVersionState:
    """One version of a model as ListModels/GetModel report it."""
    version: int
    state: str    # "READY" or "UNAVAILABLE".
    reason: str   # Why not READY ("" when it is).


@dataclass
class RepositoryModel:
    """One entry of the model repository's index (Triton's get_model_repository_index)."""
    name: str
    version: int  # 0 when the server names no version (a folder with none loadable).
    state: str    # "READY" or "UNAVAILABLE".
    reason: str   # Why not READY: a refused load names the file and what was wrong.


def model_dict(m) -> Dict[str, Any]:
    """An attention.v1.ModelInfo as the dict models() returns. "version" is the newest serving
    version, "versions" every known one with its state and reason (ModelVersionState as
    dicts)."""
    return {
        "name": m.name, "embed_dim": m.embed_dim, "num_heads": m.num_heads,
        "kdim": m.kdim, "vdim": m.vdim, "bias": m.bias, "add_bias_kv": m.add_bias_kv,
        "add_zero_attn": m.add_zero_attn,
        # False: the model takes (L, N, E) tensors (torch's batch_first=False); unset on
        # servers before the field: True.
        "batch_first": m.batch_first if m.HasField("batch_first") else True,
        "compute_dtype": attention_pb2.DataType.Name(m.compute_dtype),
        "is_default": m.is_default,
        "version": m.version,
        "versions": [{"version": v.version, "state": v.state, "reason": v.reason}
                     for v in m.versions],
        "batching": {"max_batch_size": m.batching.max_batch_size,
                     "max_batch_tokens": m.batching.max_batch_tokens,
                     "max_queue_delay_us": m.batching.max_queue_delay_us,
                     "max_queue_size": m.batching.max_queue_size},
    }


def check_name(name, argument="name"):
    """A model name argument: a non-empty str; TypeError/ValueError naming `argument`."""
    if not isinstance(name, str):
        raise TypeError(f"{argument}: expected a model name (str), got "
                        f"{type(name).__name__} {name!r}")
    if not name:
        raise ValueError(f"{argument}: expected a model name (the model's folder in the "
                         f"server's --model_repository), got ''")
    return name


def index_request(ready=False):
    return oip.RepositoryIndexRequest(ready=bool(ready))


def repository_models(response) -> List[RepositoryModel]:
    """A RepositoryIndexResponse as RepositoryModel entries, in the server's order."""
    return [RepositoryModel(name=m.name,
                            version=int(m.version) if m.version.isdigit() else 0,
                            state=m.state, reason=m.reason)
            for m in response.models]


def load_request(name):
    return attention_pb2.LoadModelRequest(name=check_name(name, "model_name"))


def unload_request(name):
    return attention_pb2.UnloadModelRequest(name=check_name(name, "model_name"))
