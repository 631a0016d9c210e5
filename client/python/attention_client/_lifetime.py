"""A clean interpreter exit for programs that use the client.

gRPC keeps working after a program's last line: the channels of a client never closed go on
reconnecting and health-checking, and grpcio's helper threads (each channel's call-event
thread, a stream's request reader, grpc.aio's poller) run until their channel is freed. If
that happens while, or after, the interpreter finalizes, gRPC calls into an interpreter that
is gone, and the process can die with SIGSEGV after its work is done (seen at the end of
python_package_test with Debian's grpcio 1.51; the token's call credentials were the other
way in, see client._BearerTokenInterceptor).

So the package registers one atexit hook, which runs while the interpreter is still whole:
it closes every client still open (AttentionClient, InferenceClient through its
AttentionClient, AsyncAttentionClient) and drops their channels, collects what referred to
them, and waits, at most EXIT_WAIT_S, for grpcio's helper threads to end. A client closed by
the program is not kept: clients are held weakly.
"""
import atexit
import gc
import threading
import time
import weakref

EXIT_WAIT_S = 1.0

_clients = weakref.WeakSet()  # Clients not closed yet; each has _release().
_lock = threading.Lock()


def track(client):
    """Registers a client to release at exit unless it is closed (or freed) first."""
    with _lock:
        _clients.add(client)


def untrack(client):
    with _lock:
        _clients.discard(client)


class Closed:
    """Stands in for a closed client's channels, stubs and callables: any use raises
    ValueError naming the client (`name`)."""

    def __init__(self, name):
        self._name = name

    def _fail(self, *args, **kwargs):
        raise ValueError(f"{self._name} is closed: make a new client for more calls")

    __call__ = _fail

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._fail


def _is_grpc_thread(thread):
    """A daemon thread running grpcio's code (grpc._cython.cygrpc or grpc.*)."""
    if not thread.daemon or thread is threading.current_thread():
        return False
    target = getattr(thread, "_target", None)
    module = getattr(target, "__module__", None)
    if module is None:
        module = type(getattr(target, "__self__", None)).__module__
    return str(module).startswith("grpc")


def grpc_threads():
    """grpcio's helper threads alive now."""
    return [t for t in threading.enumerate() if _is_grpc_thread(t)]


def release_all(wait_s=EXIT_WAIT_S):
    """Closes and drops every client still open, then waits up to wait_s for grpcio's helper
    threads to end. Returns those still alive."""
    with _lock:
        clients = list(_clients)
        _clients.clear()
    for client in clients:
        try:
            client._release()
        except Exception:  # noqa: BLE001 (at exit: release the others regardless)
            pass
    del clients
    gc.collect()  # Channels held only by cycles are freed now, not during finalization.
    deadline = time.monotonic() + wait_s
    for thread in grpc_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    return grpc_threads()


atexit.register(release_all)
