"""Streams that outlive the server closing them: reopened on UNAVAILABLE.

A stream ends with UNAVAILABLE when its connection ends under it: a replica draining past its
deadline, a proxy or load balancer recycling connections, or a server run with a finite
--max_connection_age_grace_s. The client's streams (infer_stream, session_stream,
stream_infer, and the asyncio infer_stream) then open a new stream on the same channel (so
possibly to another replica), re-send the requests sent but not answered, in the order they
were sent, and go on reading the caller's requests: the caller sees one stream.

A request is re-sent only when that is safe: attention requests (Infer, ModelInfer without a
sequence) have no side effects; a session append carries expected_length, so a copy that
finds it applied fails FAILED_PRECONDITION "expected_length: ..." instead of applying it
twice; a sequence step may carry parameters["expected_length"] likewise. When an unanswered
request is not safe to re-send, when MAX_REOPENS streams in a row end before any answer, or
when the stream's deadline has passed, the error is raised as before.

An Outbox is shared by the caller's thread (or task), which reads answers and reopens, and
gRPC's request readers (grpcio reads a stream's requests on a thread of its own; grpc.aio in
a task), of which a closed stream's may still be waiting on the caller's iterator when the
next stream starts: every request is read from the caller's iterator exactly once, under a
lock, and one read for a stream already closed is sent on the next.
"""
import asyncio
import collections
import itertools
import threading
import time

import grpc

MAX_REOPENS = 3  # Streams opened again in a row without an answer in between.
_BACKOFF_S = (0.05, 0.2, 0.5)  # Before the first, second and later reopens in a row.

_END = object()  # A stream sends nothing more.


class Outbox:
    """The requests of one logical stream across the gRPC streams that carry it.

    prepare(index, item): the request message for the caller's item number `index` (called
    once per item, in order). key(request): the id its answer echoes. resendable(request):
    whether it may be sent again when its stream closed before answering it.
    """

    def __init__(self, items, prepare, key, resendable=lambda request: True):
        self._items, self._prepare, self._key, self._resendable = items, prepare, key, resendable
        self._lock = threading.Lock()  # Guards everything below; never held while reading.
        self._generation = 0           # The stream being fed (one per open).
        self._count = 0                # Items read so far (under the reading lock).
        self._read_all = False
        self._resend = collections.deque()    # Unanswered requests the open stream sends first.
        self._sequence = itertools.count()
        self._unanswered = {}                 # Send sequence -> request, in sending order.
        self._resent = set()                  # Send sequences of requests sent again.
        self._by_key = collections.defaultdict(collections.deque)  # Key -> send sequences.

    # Bookkeeping (under _lock).

    def _track(self, request):
        number = next(self._sequence)
        self._unanswered[number] = request
        self._by_key[self._key(request)].append(number)

    def _take(self, generation):
        """What stream `generation` sends next without reading the caller's iterator: a
        request, _END (nothing more: all read, or the stream is no longer the open one) or
        None (read the next item)."""
        if generation != self._generation:
            return _END
        if self._resend:
            return self._resend.popleft()
        return _END if self._read_all else None

    def _took(self, request, generation):
        """A freshly read request, recorded as unanswered; _END if stream `generation` closed
        meanwhile (the open stream sends it first)."""
        self._track(request)
        if generation != self._generation:
            self._resend.append(request)
            return _END
        return request

    # The caller's side.

    def answered(self, key):
        """Marks the oldest unanswered request with this key answered; returns it and whether
        it was sent again (None, False for an unknown key)."""
        with self._lock:
            numbers = self._by_key.get(key)
            if not numbers:
                return None, False
            number = numbers.popleft()
            if not numbers:
                del self._by_key[key]
            resent = number in self._resent
            self._resent.discard(number)
            return self._unanswered.pop(number, None), resent

    def reopen(self):
        """After the open stream ended with UNAVAILABLE: True when a new stream is to be opened
        (the unanswered requests are queued to go first), None when nothing is left to send
        or answer (the stream is complete), False when an unanswered request may not be sent
        again."""
        with self._lock:
            if not self._unanswered and self._read_all:
                return None
            if not all(self._resendable(r) for r in self._unanswered.values()):
                return False
            self._generation += 1
            self._resend = collections.deque(self._unanswered.values())
            self._resent.update(self._unanswered)
            return True

    def generation(self):
        with self._lock:
            return self._generation


class SyncOutbox(Outbox):
    """An Outbox over a plain iterable, read on grpcio's request threads."""

    def __init__(self, items, *args, **kwargs):
        super().__init__(iter(items), *args, **kwargs)
        self._reading = threading.Lock()  # One read of the caller's iterator at a time.

    def _read(self, generation):
        with self._reading:
            with self._lock:  # Another stream's reader may have read meanwhile.
                request = self._take(generation)
            if request is not None:
                return request
            try:
                item = next(self._items)
            except StopIteration:
                with self._lock:
                    self._read_all = True
                return _END
            request = self._prepare(self._count, item)
            self._count += 1
            with self._lock:
                return self._took(request, generation)

    def messages(self):
        """The requests of the stream opened now (a generator for grpcio). The stream's
        generation is taken here, not when gRPC first reads: a stream that closed before its
        reader started sends nothing."""
        generation = self.generation()

        def requests():
            while True:
                with self._lock:
                    request = self._take(generation)
                if request is None:
                    request = self._read(generation)
                if request is _END:
                    return
                yield request
        return requests()


class AsyncOutbox(Outbox):
    """An Outbox over an iterable or async iterable, read in grpc.aio's request tasks."""

    def __init__(self, items, *args, **kwargs):
        self._async = hasattr(items, "__aiter__")
        super().__init__(items.__aiter__() if self._async else iter(items), *args, **kwargs)
        self._reading = asyncio.Lock()

    async def _read(self, generation):
        async with self._reading:
            with self._lock:
                request = self._take(generation)
            if request is not None:
                return request
            try:
                item = await self._items.__anext__() if self._async else next(self._items)
            except (StopIteration, StopAsyncIteration):
                with self._lock:
                    self._read_all = True
                return _END
            request = self._prepare(self._count, item)
            self._count += 1
            with self._lock:
                return self._took(request, generation)

    def messages(self):
        """As SyncOutbox.messages (an async generator for grpc.aio)."""
        generation = self.generation()

        async def requests():
            while True:
                with self._lock:
                    request = self._take(generation)
                if request is None:
                    request = await self._read(generation)
                if request is _END:
                    return
                yield request
        return requests()


def echoed(request_id):
    """The id as the server echoes it (cut to its 1024-byte identifier limit): the key that
    matches an answer to its request."""
    return request_id.encode()[:1024]


def _reopenable(error, outbox, reopens, deadline):
    """Whether to open a new stream after `error` ended one: True, None (the stream is
    complete: end quietly) or False (raise it)."""
    if error.code() != grpc.StatusCode.UNAVAILABLE or reopens >= MAX_REOPENS:
        return False
    if deadline is not None and time.monotonic() >= deadline:
        return False
    return outbox.reopen()


def _backoff(reopens):
    return _BACKOFF_S[min(reopens, len(_BACKOFF_S) - 1)]


def _remaining(deadline):
    return None if deadline is None else max(0.001, deadline - time.monotonic())


def stream(open_call, outbox, key_of, timeout):
    """Yields (answer, request, resent) for each answer of one logical stream: open_call(
    requests, timeout) opens a gRPC stream (grpcio); key_of(answer) gives the id the answer
    echoes; request is the request answered (None if unknown), resent whether it was sent
    again on a reopened stream. Raises grpc.RpcError."""
    deadline = None if timeout is None else time.monotonic() + timeout
    reopens = 0
    while True:
        call = open_call(outbox.messages(), _remaining(deadline))
        try:
            for answer in call:
                reopens = 0
                request, resent = outbox.answered(key_of(answer))
                yield answer, request, resent
            return
        except grpc.RpcError as error:
            again = _reopenable(error, outbox, reopens, deadline)
            if again is None:
                return
            if not again:
                raise
        finally:
            call.cancel()
        time.sleep(_backoff(reopens))
        reopens += 1


async def async_stream(open_call, outbox, key_of, timeout):
    """As stream(), over grpc.aio (raises grpc.aio.AioRpcError)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    reopens = 0
    while True:
        call = open_call(outbox.messages(), _remaining(deadline))
        try:
            async for answer in call:
                reopens = 0
                request, resent = outbox.answered(key_of(answer))
                yield answer, request, resent
            return
        except grpc.aio.AioRpcError as error:
            again = _reopenable(error, outbox, reopens, deadline)
            if again is None:
                return
            if not again:
                raise
        finally:
            call.cancel()
        await asyncio.sleep(_backoff(reopens))
        reopens += 1
