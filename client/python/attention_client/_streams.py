"""AttentionClient's streams: infer_stream (InferStream) and session_stream (SessionStream),
each reopened when the server closes it (_reopen). Generators: nothing is sent until the
caller iterates, and closing the generator cancels the stream."""
import collections
import itertools
import re

import grpc

from . import _reopen
from ._codec import _decode, _infer_result
from .errors import AttentionError, status_code
from .session import AppendResult, ReplayingSession, Session, _append_request


def infer_stream(client, requests, timeout):
    """See AttentionClient.infer_stream."""
    def prepare(index, kwargs):
        kwargs = dict(kwargs)
        if not kwargs.get("request_id"):
            kwargs["request_id"] = str(index)
        return client._infer_request(**kwargs)

    def key(message):
        return _reopen.echoed(message.request_id)

    outbox = _reopen.SyncOutbox(requests, prepare, key)
    responses = _reopen.stream(
        lambda messages, left: client._stub.InferStream(messages, timeout=left), outbox, key,
        timeout)
    try:
        for response, _, _ in responses:
            yield _infer_result(response)
    except grpc.RpcError as e:
        raise client._error(e) from None
    finally:
        responses.close()


def session_stream(client, appends, timeout):
    """See AttentionClient.session_stream."""
    appends = iter(appends)
    first = next(appends, None)
    if first is None:
        return

    def session_id(append):
        session = append["session"]
        if isinstance(session, ReplayingSession):
            raise TypeError("session_stream: a ReplayingSession cannot append on a stream "
                            "(its history would miss the appends): use Session")
        if isinstance(session, Session):
            return session.session_id
        return session

    def key(message):
        return _reopen.echoed(message.request_id)

    stub = client.session_stub(session_id(first))
    # The Sessions of the appends not answered yet, by key, in sending order (their `length`
    # follows the answers), and the length each Session's next append expects.
    sessions = collections.defaultdict(collections.deque)
    planned = {}

    def prepare(index, append):
        kwargs = dict(append)
        session = kwargs.pop("session")
        if not kwargs.get("request_id"):
            kwargs["request_id"] = str(index)
        request = _append_request(session_id(append), **kwargs)
        if isinstance(session, Session):
            # By the session's id, not the object's: a dropped Session's address may be
            # reused by the next one opened on this stream.
            expected = planned.get(session.session_id, session.length)
            request.expected_length = expected
            planned[session.session_id] = expected + (request.tokens.shape[0]
                                                      if request.tokens.shape else 0)
            sessions[key(request)].append(session)
        else:
            sessions[key(request)].append(None)
        return request

    def session_of(response):
        waiting = sessions.get(key(response))
        return waiting.popleft() if waiting else None

    outbox = _reopen.SyncOutbox(itertools.chain([first], appends), prepare, key,
                                resendable=lambda request: request.HasField("expected_length"))
    responses = _reopen.stream(
        lambda messages, left: stub.SessionStream(messages, timeout=left), outbox, key, timeout)
    try:
        for response, request, resent in responses:
            session = session_of(response)
            if response.HasField("error") and response.error.code != 0:
                error = AttentionError(status_code(response.error.code), response.error.message)
                if resent and _refused_for_length(error):
                    error = _answer_lost(request, session, error)
                yield AppendResult(output=None, attn_weights=None, length=0, queue_us=0,
                                   compute_us=0, batch_requests=0,
                                   request_id=response.request_id,
                                   session_id=response.session_id, error=error)
                continue
            if session is not None:
                session.length = response.length
            yield AppendResult(output=_decode(response.output),
                               attn_weights=_decode(response.attn_weights),
                               length=response.length, queue_us=response.queue_us,
                               compute_us=response.compute_us,
                               batch_requests=response.batch_requests,
                               request_id=response.request_id, session_id=response.session_id,
                               model_version=response.model_version)
    except grpc.RpcError as e:
        raise client._error(e) from None
    finally:
        responses.close()


def _refused_for_length(error):
    return (error.code == grpc.StatusCode.FAILED_PRECONDITION
            and (error.details or "").startswith("expected_length:"))


def _answer_lost(request, session, error):
    """For an append sent again and refused for its expected_length: DATA_LOSS when the
    session then held expected_length + T tokens, as the refusal says (the first copy was
    applied; its answer was lost with the stream; a Session's length is updated), else
    `error`. (Not GetSession: the stream's later appends may have been applied since.)"""
    held = re.search(r"the session holds (\d+) tokens", error.details or "")
    tokens = request.tokens.shape[0] if request.tokens.shape else 0
    if held is None or int(held.group(1)) != request.expected_length + tokens:
        return error
    if session is not None:
        session.length = int(held.group(1))
    return AttentionError(grpc.StatusCode.DATA_LOSS,
                          f"append {request.request_id!r} to session {request.session_id}: "
                          "applied, but its answer was lost when the server closed the stream "
                          f"(UNAVAILABLE); the session then held {held.group(1)} tokens")
