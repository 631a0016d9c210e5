"""AttentionError, and errors that say what to do.

check_target() refuses, before any call, the targets gRPC would take and then fail on in
obscure ways: a URL ("http://localhost:50051": DNS resolution of "http") and a host without a
port (gRPC's DNS resolver silently uses 443). advise() turns the raw gRPC text of a failed call
into a hint for the common mistakes: nothing listening at the target (a wrong port), a
plaintext client against a TLS server (or the reverse), a client certificate the server does
not accept, a server certificate the client does not trust, a missing or refused bearer token
(naming token=, token_file= and ATTENTION_TOKEN), a call over its deadline (naming the
client's timeout= and its value), and a message over a side's size limit (naming
max_message_bytes and the server's --max_message_bytes). The connection hints come from
probe_http2(): one plain TCP connection that sends the HTTP/2 preface and reads what comes
back (made only after a call failed to connect).
The C++ CLI (client/cli/call_advice.cc) and the Node.js client (client/node/index.js) give the
same hints.
"""
import ipaddress
import re
import socket
from typing import Optional, Tuple

import grpc

# gRPC name resolvers that take something other than host:port after the scheme.
_OTHER_SCHEMES = ("unix:", "unix-abstract:", "vsock:", "xds:", "google-c2p:")
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$")
_HOST_PORT = re.compile(r"^(?P<host>\[[^\]]*\]|[^:\[\]/]*)(?::(?P<port>[^:/]*))?$")


class AttentionError(Exception):
    """A failed call: `code` is the grpc.StatusCode, `details` the server's (or gRPC's) message,
    `hint` what to do about it when the client can tell (else None); str() has all three."""

    def __init__(self, code, details, hint=None):
        message = f"{code.name}: {details}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)
        self.code = code
        self.details = details
        self.hint = hint


def status_code(number):
    """The grpc.StatusCode of a numeric code (3: INVALID_ARGUMENT; UNKNOWN if unknown)."""
    return next((c for c in grpc.StatusCode if c.value[0] == number), grpc.StatusCode.UNKNOWN)


def _invalid(target, what):
    return AttentionError(grpc.StatusCode.INVALID_ARGUMENT, f"target {target!r}: {what}")


def _check_host_port(target, host_port, example_host, default_443=True):
    match = _HOST_PORT.match(host_port)
    if not match or not match.group("host"):
        if host_port.count(":") > 1 and not host_port.startswith("["):
            raise _invalid(target, f"an IPv6 address goes in brackets: '[{host_port}]:50051'")
        raise _invalid(target, "expected host:port, e.g. 'localhost:50051'")
    port = match.group("port")
    if port is None or port == "":
        why = " (gRPC would use 443)" if default_443 else ""
        raise _invalid(target, f"no port{why}: give host:port, e.g. "
                               f"'{example_host or match.group('host')}:50051'")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _invalid(target, f"port {port!r}: expected a number from 1 to 65535")


def check_target(target):
    """Raises AttentionError (INVALID_ARGUMENT) for a target gRPC would misread: a URL
    ("http://host:port" -> "host:port"), or host:port without the port. Targets with other
    schemes gRPC knows (dns:, ipv4:, ipv6:, unix:, ...) are checked only as far as their
    addresses are host:port."""
    if not isinstance(target, str) or not target:
        raise _invalid(target, "expected host:port, e.g. 'localhost:50051'")
    url = _URL.match(target)
    if url and url.group("scheme").lower() != "dns":
        scheme = url.group("scheme").lower()
        if scheme in ("unix", "unix-abstract", "vsock", "xds", "google-c2p"):
            return
        rest = url.group("rest").split("/", 1)[0]
        example = rest if ":" in rest.lstrip("[").split("]")[-1] else f"{rest}:50051"
        tls = " and tls=True" if scheme in ("https", "grpcs") else ""
        raise _invalid(target, f"a URL; a gRPC target is host:port: use {example!r}{tls}")
    if target.startswith(_OTHER_SCHEMES):
        return
    if target.startswith("dns:"):
        rest = target[len("dns:"):]
        if rest.startswith("//"):  # dns://[authority]/host:port
            rest = rest[2:].split("/", 1)[1] if "/" in rest[2:] else ""
        _check_host_port(target, rest, None)
        return
    for scheme in ("ipv4:", "ipv6:"):
        if target.startswith(scheme):
            for address in target[len(scheme):].split(","):
                _check_host_port(target, address, None, default_443=False)
            return
    _check_host_port(target, target, None)


def first_address(target) -> Optional[Tuple[str, int]]:
    """(host, port) of the first address of a host:port, dns: or ipv4:/ipv6: target."""
    rest = target
    if rest.startswith("dns:"):
        rest = rest[len("dns:"):]
        if rest.startswith("//"):
            rest = rest[2:].split("/", 1)[1] if "/" in rest[2:] else ""
    elif rest.startswith(("ipv4:", "ipv6:")):
        rest = rest[5:].split(",")[0]
    match = _HOST_PORT.match(rest)
    if not match or not (match.group("port") or "").isdigit():
        return None
    return match.group("host").strip("[]"), int(match.group("port"))


def names_one_server(target) -> bool:
    """True when `target` can only name one server: a numeric address (1.2.3.4:5, [::1]:5,
    ipv4:/ipv6: with one address) or a unix:/vsock: socket. False for a name the resolver
    may turn into several addresses (localhost:5, dns:///svc:5) and for address lists. The
    channel health-checks only those, as the C++ client does (TargetCheck::NamesOneServer)."""
    if target.startswith(("unix:", "unix-abstract:", "vsock:")):
        return True
    rest = target
    if rest.startswith(("ipv4:", "ipv6:")):
        if "," in rest:
            return False
        rest = rest[5:]
    match = _HOST_PORT.match(rest)
    if not match or not (match.group("port") or "").isdigit():
        return False
    try:
        ipaddress.ip_address(match.group("host").strip("[]"))
    except ValueError:
        return False
    return True


_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def probe_http2(host, port, timeout=1.0):
    """What listens at host:port, from one plaintext HTTP/2 preface: "http2" (it answered a
    SETTINGS frame: a plaintext gRPC server), "tls" (it answered a TLS record, or hung up
    without a byte: a TLS server refusing plaintext), "none" (the connection was refused:
    nothing listens there), or None (no connection otherwise, or no answer)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(_PREFACE)
            data = b""
            while len(data) < 9:
                chunk = s.recv(9 - len(data))
                if not chunk:
                    break
                data += chunk
    except ConnectionRefusedError:
        return "none"
    except ConnectionResetError:
        return "tls"
    except OSError:
        return None
    if len(data) >= 4 and data[3] == 0x04:
        return "http2"
    if not data or data[0] in (0x15, 0x16):
        return "tls"
    return None


_CONNECT_FAILURE = re.compile(r"failed to connect|Socket closed|reset by peer|[Hh]andshake|"
                              r"backends failing|Broken pipe|End of TCP stream|SSL|TLS")
_TOO_LARGE = re.compile(r"(Sent|Received) message larger than max \((\d+) vs\. (\d+)\)")


def advise(code, details, target, tls, client_certificate, max_message_bytes, timeout=None,
           token=None):
    """A hint for a failed call (None when there is none to give). code: grpc.StatusCode;
    tls: whether the client used TLS; client_certificate: whether it presented one; timeout:
    the client's timeout= in seconds (named by the deadline hint); token: whether it sent a
    bearer token (None: unknown, no token hint)."""
    details = details or ""
    too_large = _TOO_LARGE.search(details)
    if too_large:
        direction, size, limit = too_large.group(1), int(too_large.group(2)), \
            int(too_large.group(3))
        if limit == max_message_bytes:
            what = "the request" if direction == "Sent" else "the response"
            return (f"{what} is {size} bytes, over this client's limit of {limit}: raise "
                    f"max_message_bytes (the server's limit is its --max_message_bytes)")
        what = "the request" if direction == "Received" else "the response"
        return (f"{what} is {size} bytes, over the server's limit of {limit}: send less per "
                f"request, or start the server with --max_message_bytes={size} or more")
    if code == grpc.StatusCode.UNAUTHENTICATED and token is not None:
        return ("the server refused this client's bearer token (token=, else token_file=, else "
                "the ATTENTION_TOKEN environment variable): use one the server's "
                "--auth_tokens_file lists" if token else
                "the server wants a bearer token: pass token='<token>' or token_file='<file>' "
                "to AttentionClient(), or set the ATTENTION_TOKEN environment variable")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and timeout:
        return (f"the call took longer than timeout={timeout:g} s: raise it (the timeout "
                f"argument of AttentionClient(), e.g. timeout={timeout * 4:g}) if the server is "
                f"busy or the request large")
    if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN) or \
            not _CONNECT_FAILURE.search(details):
        return None
    if tls and re.search(r"certificate[ _]verify[ _]failed", details, re.I):
        return ("the client does not trust the server's certificate: pass tls_ca_file= the "
                "CA that signed it, or tls_server_name= a name it carries")
    address = first_address(target)
    answer = probe_http2(*address) if address else None
    if answer == "none":
        host, port = address
        at = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return (f"nothing is listening at {at} (the target {target!r})? start attention-server "
                f"there (its --port), or pass the host:port of a running one: "
                f"AttentionClient('host:port')")
    if not tls and answer == "tls":
        return ("the server speaks TLS: pass tls=True (and tls_ca_file= its CA unless the "
                "system trusts it)")
    if tls and answer == "http2":
        return "the server speaks plaintext, not TLS: leave out tls and the tls_* arguments"
    if tls and re.search(r"certificate[ _]required", details, re.I):
        return ("the server requires a client certificate (mutual TLS): pass tls_cert_file "
                "and tls_key_file")
    if tls and re.search(r"unknown[ _]ca|bad[ _]certificate|certificate[ _]unknown|"
                         r"decrypt[ _]error", details, re.I):
        return ("the server did not accept the client certificate: use one signed by a CA the "
                "server trusts (its --tls_client_ca_file)")
    if tls and answer == "tls" and client_certificate is False:
        return ("the TLS handshake failed: if the server requires a client certificate "
                "(mutual TLS), pass tls_cert_file and tls_key_file")
    if tls and answer == "tls":
        return ("the TLS handshake failed: the server did not accept the client certificate; "
                "use one signed by a CA the server trusts (its --tls_client_ca_file)")
    return None


def from_rpc_error(error, target, tls, client_certificate, max_message_bytes, timeout=None,
                   token=None):
    """An AttentionError for a grpc.RpcError, with advise()'s hint."""
    code, details = error.code(), error.details()
    return AttentionError(code, details, advise(code, details, target, tls, client_certificate,
                                                max_message_bytes, timeout, token))
