"""The security of the client's channels: TLS credentials, the bearer token (an interceptor
adding `authorization: Bearer <token>`), and the argparse flags that choose them. Shared by
AttentionClient, InferenceClient and the asyncio client; imports nothing of the package.
Stateless but for the interceptors, which hold their token: safe from any thread."""
import collections
import os

import grpc


TOKEN_ENV = "ATTENTION_TOKEN"  # The bearer token when neither token nor token_file is given.

# How the client's channels reach the server: TLS credentials (None: plaintext), extra channel
# options (the TLS server name) and the interceptor adding the token (None: no token).
_Security = collections.namedtuple("_Security", ("credentials", "options", "interceptor"))


def _read_file(argument, path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise type(e)(e.errno, f"{argument}: cannot read {path!r}: {e.strerror}") from None


def resolve_token(token=None, token_file=None):
    """The bearer token the client sends: `token` if not None ("" for none), else the contents
    of `token_file`, else the environment variable ATTENTION_TOKEN; whitespace around it is
    dropped. None when there is no token. ValueError if both are given, if token_file is
    empty, or if the token is not printable ASCII without spaces (an HTTP/2 header value)."""
    if token is not None and token_file is not None:
        raise ValueError("token and token_file: give one, not both")
    if token is not None:
        source, value = "token", token
    elif token_file is not None:
        source = "token_file"
        value = _read_file("token_file", token_file).decode("ascii", errors="replace").strip()
        if not value:
            raise ValueError(f"token_file: {token_file!r} is empty")
    else:
        source, value = TOKEN_ENV, os.environ.get(TOKEN_ENV, "")
    value = value.strip()
    if any(not 0x21 <= ord(c) <= 0x7E for c in value):
        raise ValueError(f"{source}: a bearer token is printable ASCII without spaces")
    return value or None


class _CallDetails(collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                         "compression")), grpc.ClientCallDetails):
    pass


class _BearerTokenInterceptor(grpc.UnaryUnaryClientInterceptor,
                              grpc.UnaryStreamClientInterceptor,
                              grpc.StreamUnaryClientInterceptor,
                              grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call of a channel, plaintext or TLS, in
    the caller's thread. Not gRPC's call credentials (grpc.access_token_call_credentials):
    gRPC refuses those on plaintext, and over TLS they are Python code that gRPC Core calls,
    and finally frees, on threads of its own; when it frees them after the interpreter has
    finalized (a connection torn down as the process exits), the process dies with SIGSEGV
    (seen with Debian's grpcio 1.51)."""

    def __init__(self, token):
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details):
        return _CallDetails(details.method, details.timeout,
                            list(details.metadata or ()) + [self._header], details.credentials,
                            getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._with_token(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._with_token(client_call_details), request_iterator)


def channel_security(tls=False, tls_ca_file=None, tls_cert_file=None, tls_key_file=None,
                     tls_server_name=None, token=None, token_file=None):
    """Checks and reads AttentionClient's security arguments (see there) into a _Security.
    ValueError names the argument at fault; an unreadable file raises OSError naming it."""
    if tls_cert_file and not tls_key_file:
        raise ValueError("tls_key_file: required with tls_cert_file (a client certificate "
                         "needs its private key)")
    if tls_key_file and not tls_cert_file:
        raise ValueError("tls_cert_file: required with tls_key_file (a private key needs its "
                         "certificate)")
    token = resolve_token(token, token_file)
    interceptor = _BearerTokenInterceptor(token) if token else None
    if not (tls or tls_ca_file or tls_cert_file or tls_server_name):
        return _Security(credentials=None, options=[], interceptor=interceptor)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read_file("tls_ca_file", tls_ca_file) if tls_ca_file else None,
        private_key=_read_file("tls_key_file", tls_key_file) if tls_key_file else None,
        certificate_chain=_read_file("tls_cert_file", tls_cert_file) if tls_cert_file else None)
    options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
    return _Security(credentials=credentials, options=options, interceptor=interceptor)


def add_security_flags(parser):
    """Adds --tls, --tls_ca_file, --tls_cert_file, --tls_key_file, --tls_server_name and
    --token_file (attention-client's flags) to an argparse parser; pass
    security_kwargs(args) to AttentionClient."""
    group = parser.add_argument_group("security")
    group.add_argument("--tls", action="store_true",
                       help="use TLS (implied by any --tls_* flag); system roots by default")
    group.add_argument("--tls_ca_file", help="PEM roots to trust instead of the system's")
    group.add_argument("--tls_cert_file", help="PEM client certificate (mutual TLS)")
    group.add_argument("--tls_key_file", help="PEM private key of --tls_cert_file")
    group.add_argument("--tls_server_name",
                       help="name expected in the server's certificate (default: the target's)")
    group.add_argument("--token_file", help="file holding a bearer token, sent as "
                       f"'authorization: Bearer <token>' (default: ${TOKEN_ENV}, if set)")


def security_kwargs(args):
    """AttentionClient keyword arguments from the flags of add_security_flags."""
    return {"tls": args.tls, "tls_ca_file": args.tls_ca_file, "tls_cert_file": args.tls_cert_file,
            "tls_key_file": args.tls_key_file, "tls_server_name": args.tls_server_name,
            "token_file": args.token_file}
