"""The generated protobuf messages and gRPC stubs, for calls the client has no method for:

    from attention_client.stubs import attention_pb2, attention_pb2_grpc
    from attention_client.stubs import grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc

attention.v1 (attention_pb2, sessions_pb2 and their _grpc stubs) and the Open Inference
Protocol (grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc, model_config_pb2).
"""
from ._stubs import (attention_pb2, attention_pb2_grpc, grpc_predict_v2_pb2,  # noqa: F401
                     grpc_predict_v2_pb2_grpc, model_config_pb2, sessions_pb2,
                     sessions_pb2_grpc)

__all__ = ["attention_pb2", "attention_pb2_grpc", "sessions_pb2", "sessions_pb2_grpc",
           "grpc_predict_v2_pb2", "grpc_predict_v2_pb2_grpc", "model_config_pb2"]
