#!/usr/bin/env python3
"""The naive baseline for the server benchmark: attention.v1 over grpcio and PyTorch, no batching.

    /usr/bin/python3 bench/naive_server.py --port 50061 --embed_dim 256 --num_heads 8 [--seed 0]

What a team would write first: a grpcio server (a thread per call, up to 64) whose Infer decodes
the float32 query (and key/value), runs torch.nn.MultiheadAttention(need_weights=False) under
torch.inference_mode(), and encodes the output. GetModel and ListModels answer enough for
attention-client's load generator; other features (streams, masks, dtypes) are not served.
PyTorch runs with torch.set_num_threads(1) (OpenBLAS keeps its own threads): its fastest
configuration on this 2-core machine. Needs the Python stubs (ATTENTION_PY_GEN, built into
build/client/python/gen).
"""
import argparse
import os
import sys
from concurrent import futures

import grpc
import numpy as np
import torch

sys.path.insert(0, os.environ.get("ATTENTION_PY_GEN", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "build", "client", "python", "gen")))
from attention.v1 import attention_pb2, attention_pb2_grpc  # noqa: E402


def decode(tensor):
    if tensor.dtype != attention_pb2.DATA_TYPE_FLOAT32:
        raise ValueError("the naive server takes float32 tensors only")
    return torch.from_numpy(np.frombuffer(tensor.data, dtype="<f4").reshape(tuple(tensor.shape)))


class NaiveService(attention_pb2_grpc.AttentionServiceServicer):
    def __init__(self, mha):
        self.mha = mha

    def Infer(self, request, context):
        try:
            q = decode(request.query)
            k = decode(request.key) if request.HasField("key") else q
            v = decode(request.value) if request.HasField("value") else k
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        with torch.inference_mode():
            out, _ = self.mha(q, k, v, need_weights=False)
        response = attention_pb2.InferResponse(request_id=request.request_id, batch_requests=1)
        response.output.dtype = attention_pb2.DATA_TYPE_FLOAT32
        response.output.shape.extend(out.shape)
        response.output.data = out.contiguous().numpy().tobytes()
        return response

    def _info(self):
        e = self.mha.embed_dim
        return attention_pb2.ModelInfo(name="naive", embed_dim=e, num_heads=self.mha.num_heads,
                                       kdim=e, vdim=e, bias=True, is_default=True)

    def GetModel(self, request, context):
        return self._info()

    def ListModels(self, request, context):
        return attention_pb2.ListModelsResponse(models=[self._info()])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--embed_dim", type=int, default=256)
    parser.add_argument("--num_heads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    mha = torch.nn.MultiheadAttention(args.embed_dim, args.num_heads, batch_first=True).eval()
    options = [("grpc.max_receive_message_length", 64 << 20),
               ("grpc.max_send_message_length", 64 << 20)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=options)
    attention_pb2_grpc.add_AttentionServiceServicer_to_server(NaiveService(mha), server)
    server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print(f"naive server on 127.0.0.1:{args.port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
