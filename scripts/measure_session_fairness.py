#!/usr/bin/python3
"""Measures session fairness between two tokens (issue 21, item 4).

Starts attention-server (the built-in demo model, E=256) with two tokens whose
entries share the name "team", lets token A create --a_sessions sessions and
append 16 tokens to each, waits past the eviction grace (so that A's sessions
are evictable by age), then lets token B call CreateSession --b_attempts times
as fast as it can. Prints what B got, how many of A's sessions survive, whether
A can still create one, and the session ends by reason.

  scripts/measure_session_fairness.py [--server build/bin/attention-server]
      [--py_gen build/client/python/gen] [--a_sessions 10] [--b_attempts 5000]
      [-- extra server flags, e.g. --max_sessions=4]
"""
import argparse
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default=os.path.join(root, "build/bin/attention-server"))
    parser.add_argument("--py_gen", default=os.path.join(root, "build/client/python/gen"))
    parser.add_argument("--a_sessions", type=int, default=10)
    parser.add_argument("--b_attempts", type=int, default=5000)
    parser.add_argument("server_flags", nargs="*")
    args = parser.parse_args()
    sys.path.insert(0, args.py_gen)
    import grpc
    from attention.v1 import attention_pb2 as apb
    from attention.v1 import sessions_pb2 as pb
    from attention.v1 import sessions_pb2_grpc as pbg

    work = tempfile.mkdtemp(prefix="fairness_")
    tokens_file = os.path.join(work, "tokens")
    with open(tokens_file, "w") as f:
        for token in ("token-a", "token-b"):
            f.write(f"{hashlib.sha256(token.encode()).hexdigest()} team *\n")
    port, metrics_port = free_port(), free_port()
    with open(os.path.join(work, "server.log"), "w") as log:
        server = subprocess.Popen(
            [args.server, f"--port={port}", f"--metrics_port={metrics_port}", "--http_port=0", "--host=127.0.0.1",
             f"--auth_tokens_file={tokens_file}", "--warmup=false"] + args.server_flags,
            stderr=log)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = pbg.SessionServiceStub(channel)
        a = (("authorization", "Bearer token-a"),)
        b = (("authorization", "Bearer token-b"),)
        create = pb.CreateSessionRequest(kind=pb.SESSION_KIND_SELF)

        def create_when_ready(metadata):
            for _ in range(600):
                try:
                    return stub.CreateSession(create, metadata=metadata, timeout=10).session_id
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    time.sleep(0.1)
            raise RuntimeError("the server did not become ready")

        tokens = apb.Tensor(dtype=apb.DATA_TYPE_FLOAT32, shape=[16, 256])
        tokens.data = np.random.default_rng(1).random((16, 256), dtype=np.float32).tobytes()
        mine = [create_when_ready(a) for _ in range(args.a_sessions)]
        for sid in mine:
            stub.Append(pb.AppendRequest(session_id=sid, tokens=tokens), metadata=a, timeout=10)
        time.sleep(3)  # Past the default 2 s grace.
        created = refused = 0
        refusal = ""
        start = time.time()
        for _ in range(args.b_attempts):
            try:
                stub.CreateSession(create, metadata=b, timeout=10)
                created += 1
            except grpc.RpcError as e:
                refused += 1
                refusal = f"{e.code().name}: {e.details()}"
        seconds = time.time() - start
        alive = 0
        for sid in mine:
            try:
                info = stub.GetSession(pb.GetSessionRequest(session_id=sid), metadata=a,
                                       timeout=10)
                alive += info.length == 16
            except grpc.RpcError:
                pass
        try:
            stub.CreateSession(create, metadata=a, timeout=10)
            a_next = "OK"
        except grpc.RpcError as e:
            a_next = f"{e.code().name}: {e.details()}"
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read()
        ends = [line for line in metrics.decode().splitlines()
                if line.startswith("attention_session_ends_total") and not line.endswith(" 0")]
        print(f"B: {created} created, {refused} refused of {args.b_attempts} in {seconds:.2f} s"
              f" ({args.b_attempts / seconds:.0f}/s); last refusal: {refusal or '-'}")
        print(f"A: {alive} of {len(mine)} sessions survive; A's next CreateSession: {a_next}")
        print("session ends:", ", ".join(ends) or "none")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
