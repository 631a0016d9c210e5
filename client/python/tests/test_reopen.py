"""The Python client's streams survive the server closing them (attention_client._reopen).

Against a live attention-server that cuts every stream 0.2 s + 0.1 s into its connection
(--max_connection_age_s=0.2 --max_connection_age_grace_s=0.1: GOAWAY, then the connection
closed under the streams still open): infer_stream, session_stream, the Open Inference
Protocol's stream_infer and the asyncio infer_stream each run a paced stream of 1.2 s or
more, so cut at least three times, and every request is answered once, with the rows of
a unary call (a session's, with those of one causal call). Against a fake grpcio server that
ends a stream with UNAVAILABLE after reading a request it did not answer: that request is
sent again on the next stream and answered once; an unanswered append to a bare session id
(no expected_length: not safe to re-send) and a server that never answers raise the
UNAVAILABLE as before.

Run by CTest as python_reopen_test against the source tree; by hand:
ATTENTION_PY_GEN=build/client/python/gen PYTHONPATH=client/python
ATTENTION_SERVER_BINARY=build/bin/attention-server /usr/bin/python3 -m unittest
client/python/tests/test_reopen.py
"""
import asyncio
import os
import signal
import socket
import subprocess
import threading
import time
import unittest
from concurrent import futures

import grpc
import numpy as np

from attention_client import AttentionClient, AttentionError, InferenceClient
from attention_client.aio import AsyncAttentionClient
from attention_client.stubs import attention_pb2, sessions_pb2

SERVER = os.environ.get("ATTENTION_SERVER_BINARY", "attention-server")
PACE_S = 0.04  # Between the requests of a paced stream.
REQUESTS = 30  # Per paced stream: 1.2 s at least, four connection lifetimes.


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def paced(items):
    for item in items:
        time.sleep(PACE_S)
        yield item


STATE = {}


def setUpModule():
    port = free_port()
    STATE["server"] = subprocess.Popen(
        [SERVER, "--host=127.0.0.1", f"--port={port}", "--metrics_port=0", "--http_port=0",
         "--max_connection_age_s=0.2", "--max_connection_age_grace_s=0.1"],
        stderr=subprocess.DEVNULL)
    STATE["target"] = f"127.0.0.1:{port}"
    with AttentionClient(STATE["target"], timeout=5) as client:
        if not client.wait_ready(60):
            STATE["server"].kill()
            raise RuntimeError("attention-server did not become ready")


def tearDownModule():
    STATE["server"].send_signal(signal.SIGTERM)
    assert STATE["server"].wait(timeout=60) == 0


class CutStreamsTest(unittest.TestCase):
    """Streams longer than the server lets a connection live, against attention-server."""

    def setUp(self):
        self.client = AttentionClient(STATE["target"], timeout=60)
        self.rng = np.random.default_rng(11)

    def tearDown(self):
        self.client.close()

    def randn(self, *shape):
        return self.rng.standard_normal(shape, dtype=np.float32)

    def test_infer_stream(self):
        queries = [self.randn(1, 3, 256) for _ in range(REQUESTS)]
        results = list(self.client.infer_stream(paced({"query": q} for q in queries)))
        self.assertEqual(sorted(int(r.request_id) for r in results), list(range(REQUESTS)))
        for r in results:
            self.assertIsNone(r.error)
            np.testing.assert_allclose(r.output, self.client.infer(queries[int(r.request_id)])
                                       .output, atol=1e-6)

    def test_session_stream(self):
        x, y = self.randn(REQUESTS, 256), self.randn(REQUESTS, 256)
        with self.client.session() as a, self.client.session() as b:
            appends, rows = [], {}  # rows: request id -> (session, its rows of one causal call)
            want_a = self.client.infer(x, is_causal=True).output
            want_b = self.client.infer(y[:REQUESTS // 2], is_causal=True).output
            for i in range(REQUESTS // 2):
                appends += [{"session": a, "tokens": x[2 * i:2 * i + 2]},
                            {"session": b, "tokens": y[i:i + 1]}]
                rows[str(2 * i)] = (a.session_id, want_a[2 * i:2 * i + 2])
                rows[str(2 * i + 1)] = (b.session_id, want_b[i:i + 1])
            results = list(self.client.session_stream(paced(appends)))
            self.assertEqual(sorted(int(r.request_id) for r in results), list(range(REQUESTS)))
            for r in results:
                session_id, want = rows[r.request_id]
                if r.error is not None:
                    # Applied, its answer lost as the server cut the stream: never applied
                    # twice (the lengths below), never a wrong row.
                    self.assertEqual(r.error.code, grpc.StatusCode.DATA_LOSS, r.error)
                    continue
                self.assertEqual(r.session_id, session_id)
                np.testing.assert_allclose(r.output, want, atol=1e-5)
            self.assertEqual((a.length, b.length), (REQUESTS, REQUESTS // 2))
            self.assertEqual((a.info().length, b.info().length), (REQUESTS, REQUESTS // 2))

    def test_stream_infer(self):
        queries = [self.randn(1, 2, 256) for _ in range(REQUESTS)]
        with InferenceClient(STATE["target"], timeout=60) as oip:
            results = list(oip.stream_infer(paced({"model": "demo", "inputs": {"query": q}}
                                                  for q in queries)))
        self.assertEqual(sorted(int(r.id) for r in results), list(range(REQUESTS)))
        for r in results:
            self.assertIsNone(r.error)
            np.testing.assert_allclose(r.outputs["output"],
                                       self.client.infer(queries[int(r.id)]).output, atol=1e-6)

    def test_asyncio_infer_stream(self):
        queries = [self.randn(1, 3, 256) for _ in range(REQUESTS)]

        async def requests():
            for q in queries:
                await asyncio.sleep(PACE_S)
                yield {"query": q}

        async def run():
            async with AsyncAttentionClient(STATE["target"], timeout=60) as client:
                return [r async for r in client.infer_stream(requests())]

        results = asyncio.run(run())
        self.assertEqual(sorted(int(r.request_id) for r in results), list(range(REQUESTS)))
        for r in results:
            self.assertIsNone(r.error)
            np.testing.assert_allclose(r.output, self.client.infer(queries[int(r.request_id)])
                                       .output, atol=1e-6)


INFER_STREAM = "/attention.v1.AttentionService/InferStream"
SESSION_STREAM = "/attention.v1.SessionService/SessionStream"


class _Cutter(grpc.GenericRpcHandler):
    """A fake server whose first `cuts` streams each answer `answer` requests, read one more
    and end with UNAVAILABLE without answering it (an append applied first if
    `apply_cut`); later streams answer everything. Records every stream's requests. Its one
    session ("s", `length` tokens) refuses an append whose expected_length differs, with
    attention-server's message."""

    def __init__(self, cuts=1, answer=2, apply_cut=False, length=0):
        self.cuts, self.answer, self.apply_cut, self.length = cuts, answer, apply_cut, length
        self.streams = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers([self])
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def stop(self):
        self._server.stop(None)

    def service(self, details):
        if details.method == INFER_STREAM:
            return grpc.stream_stream_rpc_method_handler(
                self._infer, request_deserializer=attention_pb2.InferRequest.FromString,
                response_serializer=attention_pb2.InferResponse.SerializeToString)
        if details.method == SESSION_STREAM:
            return grpc.stream_stream_rpc_method_handler(
                self._append, request_deserializer=sessions_pb2.AppendRequest.FromString,
                response_serializer=sessions_pb2.AppendResponse.SerializeToString)
        return None

    def _stream(self, requests, context, answer_of):
        with self._lock:
            seen = []
            self.streams.append(seen)
            cut = len(self.streams) <= self.cuts
        for request in requests:
            seen.append(request)
            if cut and len(seen) > self.answer:
                if self.apply_cut:
                    answer_of(request)  # Applied; the answer is lost with the stream.
                context.abort(grpc.StatusCode.UNAVAILABLE, "connection closed (test)")
            yield answer_of(request)

    def _infer(self, requests, context):
        return self._stream(requests, context,
                            lambda r: attention_pb2.InferResponse(request_id=r.request_id))

    def _apply(self, request):
        if request.expected_length != self.length:
            return sessions_pb2.AppendResponse(
                request_id=request.request_id, session_id=request.session_id,
                error=attention_pb2.Error(
                    code=grpc.StatusCode.FAILED_PRECONDITION.value[0],
                    message=f"expected_length: the session holds {self.length} tokens, the "
                            f"append expected {request.expected_length}"))
        self.length += request.tokens.shape[0]
        return sessions_pb2.AppendResponse(request_id=request.request_id,
                                           session_id=request.session_id, length=self.length)

    def _append(self, requests, context):
        return self._stream(requests, context, self._apply)


class ReopenTest(unittest.TestCase):
    """The reopening itself, against a fake server that ends streams on cue."""

    def setUp(self):
        self.server = None

    def tearDown(self):
        if self.server is not None:
            self.server.stop()

    def client(self, cutter):
        self.server = cutter
        client = AttentionClient(cutter.address, timeout=30, load_balancing="pick_first")
        self.addCleanup(client.close)
        return client

    def test_an_unanswered_request_is_sent_again_and_answered_once(self):
        cutter = _Cutter(cuts=2, answer=2)
        client = self.client(cutter)
        query = np.zeros((1, 2, 8), np.float32)
        ids = [r.request_id for r in client.infer_stream({"query": query} for _ in range(8))]
        self.assertEqual(sorted(ids, key=int), [str(i) for i in range(8)])
        streams = [[r.request_id for r in s] for s in cutter.streams]
        self.assertEqual(len(streams), 3)
        # Each stream starts with what the one before read but did not answer.
        self.assertEqual(streams[0][:3], ["0", "1", "2"])
        self.assertEqual(streams[1][0], "2")
        self.assertEqual(streams[2][0], streams[1][2])
        self.assertEqual(sorted(set(sum(streams, [])), key=int), [str(i) for i in range(8)])

    def test_session_appends_are_sent_again_with_their_expected_length(self):
        from attention_client import Session
        cutter = _Cutter(cuts=1, answer=1, length=5)
        client = self.client(cutter)
        session = Session.__new__(Session)  # Not created on the (fake) server.
        session.session_id, session.length = "s", 5
        tokens = np.zeros((2, 8), np.float32)
        results = list(client.session_stream({"session": session, "tokens": tokens}
                                             for _ in range(4)))
        self.assertEqual([r.length for r in results], [7, 9, 11, 13])
        self.assertEqual(session.length, 13)
        first, second = cutter.streams
        self.assertEqual([r.expected_length for r in first[:2]], [5, 7])
        self.assertEqual(second[0].request_id, "1")
        self.assertEqual([r.expected_length for r in second], [7, 9, 11])

    def test_an_append_applied_whose_answer_was_lost_is_data_loss(self):
        from attention_client import Session
        cutter = _Cutter(cuts=1, answer=1, apply_cut=True, length=5)
        client = self.client(cutter)
        session = Session.__new__(Session)
        session.session_id, session.length = "s", 5
        tokens = np.zeros((2, 8), np.float32)
        results = list(client.session_stream({"session": session, "tokens": tokens}
                                             for _ in range(4)))
        self.assertEqual([r.error.code if r.error else r.length for r in results],
                         [7, grpc.StatusCode.DATA_LOSS, 11, 13])
        self.assertIn("applied, but its answer was lost", results[1].error.details)
        self.assertEqual((session.length, cutter.length), (13, 13))  # Each applied once.

    def test_an_unanswered_append_to_a_bare_session_id_is_not_sent_again(self):
        cutter = _Cutter(cuts=1, answer=1)
        client = self.client(cutter)
        tokens = np.zeros((2, 8), np.float32)
        with self.assertRaises(AttentionError) as ctx:
            list(client.session_stream({"session": "bare-id", "tokens": tokens}
                                       for _ in range(4)))
        self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(len(cutter.streams), 1)

    def test_streams_that_end_before_any_answer_give_up(self):
        cutter = _Cutter(cuts=100, answer=0)
        client = self.client(cutter)
        with self.assertRaises(AttentionError) as ctx:
            list(client.infer_stream({"query": np.zeros((1, 2, 8), np.float32)}
                                     for _ in range(3)))
        self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAVAILABLE)
        # The first stream and MAX_REOPENS (3) more, each tried 4 times by gRPC's own retry
        # policy (the channel's: UNAVAILABLE before any answer).
        self.assertEqual(len(cutter.streams), 4 * 4)


if __name__ == "__main__":
    unittest.main()
