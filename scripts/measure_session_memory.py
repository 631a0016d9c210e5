#!/usr/bin/env python3
# Peak RSS (VmHWM, kB) of attention-server under the session loads of issue 21 item 3
# (--max_inflight_bytes=64MiB): one cross-session append of 16000 float16 tokens over
# 1024 keys with averaged weights, and four appends of 4096 tokens batched together.
# Usage: /usr/bin/python3 scripts/measure_session_memory.py build/bin/attention-server
# Prints ([VmHWM, VmRSS] before, [VmHWM, VmRSS] after, outcome) per load.
import os, subprocess, sys, time, threading
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "build/client/python/gen"))
import numpy as np, grpc
from attention.v1 import sessions_pb2 as s_pb, sessions_pb2_grpc as s_grpc, attention_pb2 as a_pb

def hwm(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(("VmHWM", "VmRSS")): yield line.split()[1]

def tensor(a, dt):
    t = a_pb.Tensor(dtype=dt, shape=list(a.shape), data=a.tobytes()); return t

def run(binary, extra, scenario):
    port = 50700 + os.getpid() % 200
    p = subprocess.Popen([binary, f"--port={port}", "--metrics_port=0", "--http_port=0", "--host=127.0.0.1",
                          "--max_inflight_bytes=67108864", "--max_batch_tokens=20000", *extra],
                         stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if line.startswith("ready: serving"): break
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    ch = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 1 << 30), ("grpc.max_send_message_length", 1 << 30)])
    stub = s_grpc.SessionServiceStub(ch)
    before = list(hwm(p.pid))
    results = scenario(stub)
    after = list(hwm(p.pid))
    p.terminate(); p.wait()
    return before, after, results

E = 256
def big_append(stub):
    rng = np.random.default_rng(1)
    key = rng.standard_normal((1024, E), dtype=np.float32)
    info = stub.CreateSession(s_pb.CreateSessionRequest(kind=s_pb.SESSION_KIND_CROSS, key=tensor(key, a_pb.DATA_TYPE_FLOAT32)), timeout=60)
    q = rng.standard_normal((16000, E), dtype=np.float32).astype(np.float16)
    try:
        r = stub.Append(s_pb.AppendRequest(session_id=info.session_id, tokens=tensor(q, a_pb.DATA_TYPE_FLOAT16), need_weights=True), timeout=120)
        return "OK"
    except grpc.RpcError as e:
        return f"{e.code().name}: {e.details()[:160]}"

def four_batched(stub):
    rng = np.random.default_rng(2)
    key = rng.standard_normal((1024, E), dtype=np.float32)
    ids = [stub.CreateSession(s_pb.CreateSessionRequest(kind=s_pb.SESSION_KIND_CROSS, key=tensor(key, a_pb.DATA_TYPE_FLOAT32)), timeout=60).session_id for _ in range(4)]
    q = rng.standard_normal((4096, E), dtype=np.float32).astype(np.float16)
    out = []
    def one(i):
        try:
            stub.Append(s_pb.AppendRequest(session_id=i, tokens=tensor(q, a_pb.DATA_TYPE_FLOAT16), need_weights=True), timeout=120); out.append("OK")
        except grpc.RpcError as e:
            out.append(e.code().name)
    th = [threading.Thread(target=one, args=(i,)) for i in ids]
    [t.start() for t in th]; [t.join() for t in th]
    return out

binary = sys.argv[1]
print("one append T=16000 over 1024 keys, fp16, averaged weights:", run(binary, [], big_append))
print("four appends T=4096 batched (max_queue_delay_us=200000):", run(binary, ["--max_queue_delay_us=200000"], four_batched))
