"""python -m attention_client {health,models,repository,load,unload,infer} [--server HOST:PORT]

    python -m attention_client health --wait 30     # waits until SERVING; exit 0 only then
    python -m attention_client models               # with each model's versions and their state
    python -m attention_client repository           # every model folder: version, state, reason
    python -m attention_client load encoder         # --model_control=explicit servers
    python -m attention_client unload encoder
    python -m attention_client infer --batch 2 --seq_len 16 --need_weights
    python -m attention_client infer --query q.npy --output out.npy

The security flags are attention-client's (--tls, --tls_ca_file, --tls_cert_file,
--tls_key_file, --tls_server_name, --token_file; else $ATTENTION_TOKEN). Errors go to stderr
with what to do when the client can tell; the exit code is 1 for a failed call, 2 for a bad
flag or target.
"""
import argparse
import sys

import grpc
import numpy as np

from . import __version__
from .client import MAX_MESSAGE_BYTES, AttentionClient, add_security_flags, security_kwargs
from .errors import AttentionError


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m attention_client",
        description="Client of attention-service (attention.v1 over gRPC).",
        epilog="Each command takes --help, e.g. python -m attention_client infer --help.")
    parser.add_argument("--version", action="version",
                        version=f"attention-client (Python) {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", default="localhost:50051",
                        help="gRPC target: host:port, dns:///host:port, ipv4:a:p,b:p "
                             "(default: %(default)s)")
    common.add_argument("--timeout", type=float, default=10.0,
                        help="deadline of each call, in seconds (default: %(default)s)")
    common.add_argument("--max_message_bytes", type=int, default=MAX_MESSAGE_BYTES,
                        help="largest message sent or received (default: %(default)s)")
    add_security_flags(common)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    health = commands.add_parser("health", parents=[common],
                                 help="grpc.health.v1 status; exit 0 only when SERVING")
    health.add_argument("--service", default="", help="service name ('' = the whole server)")
    health.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="wait up to this long for SERVING (polls every 0.1 s)")
    commands.add_parser("models", parents=[common],
                        help="the served models, with their versions and states")
    repository = commands.add_parser("repository", parents=[common],
                                     help="the repository index: every model folder's versions, "
                                          "state and reason")
    repository.add_argument("--ready", action="store_true", help="only READY versions")
    for name, text in (("load", "load (or re-read) a model from the repository"),
                       ("unload", "stop serving every version of a model")):
        command = commands.add_parser(name, parents=[common],
                                      help=f"{text} (--model_control=explicit)")
        command.add_argument("model_name", help="the model's folder name in the repository")
    infer = commands.add_parser("infer", parents=[common],
                                help="one request (random inputs, or .npy files)")
    infer.add_argument("--model", default="", help="model name (default: the server's)")
    infer.add_argument("--model_version", type=int, default=0,
                       help="the version to run (default 0: the newest serving)")
    infer.add_argument("--query", help=".npy query (N, L, E) or (L, E); default: random")
    infer.add_argument("--key", help=".npy key; absent: the query")
    infer.add_argument("--value", help=".npy value; absent: the key")
    infer.add_argument("--key_padding_mask", help=".npy key_padding_mask (bool or float)")
    infer.add_argument("--batch", type=int, default=1, help="random query's N (default: 1)")
    infer.add_argument("--seq_len", type=int, default=32, help="random query's L (default: 32)")
    infer.add_argument("--seed", type=int, default=1, help="seed of the random query")
    infer.add_argument("--is_causal", action="store_true", help="apply the causal mask")
    infer.add_argument("--need_weights", action="store_true", help="return attention weights")
    infer.add_argument("--output", help="save the output to this .npy file")
    return parser


def _summary(array):
    values = np.asarray(array, dtype=np.float64)
    first = ", ".join(f"{v:.5g}" for v in values.ravel()[:4])
    return (f"mean {values.mean():.5g} std {values.std():.5g} min {values.min():.5g} "
            f"max {values.max():.5g} first [{first}{', ...' if values.size > 4 else ''}]")


def _infer(client, args):
    load = (lambda path: None if path is None else np.load(path))
    query = load(args.query)
    key, value, mask = load(args.key), load(args.value), load(args.key_padding_mask)
    if query is None:
        models = client.models()
        model = next((m for m in models if m["name"] == args.model or
                      (not args.model and m["is_default"])), None)
        if model is None:
            raise AttentionError(grpc.StatusCode.NOT_FOUND,
                                 f"model {args.model!r} is not served: "
                                 f"{', '.join(m['name'] for m in models)}")
        rng = np.random.default_rng(args.seed)
        query = rng.standard_normal((args.batch, args.seq_len, model["embed_dim"]),
                                    dtype=np.float32)
    result = client.infer(query, key=key, value=value, key_padding_mask=mask,
                          is_causal=args.is_causal, need_weights=args.need_weights,
                          model=args.model, request_id="python-cli",
                          model_version=args.model_version)
    print(f"request_id   {result.request_id}")
    print(f"model        {args.model or '(default)'} version {result.model_version}")
    print(f"query        {list(np.shape(query))}")
    print(f"output       {list(result.output.shape)} {result.output.dtype}")
    print(f"  {_summary(result.output)}")
    if result.attn_weights is not None:
        print(f"attn_weights {list(result.attn_weights.shape)}\n  {_summary(result.attn_weights)}")
    print(f"server       queue {result.queue_us} us, compute {result.compute_us} us, batch of "
          f"{result.batch_requests} request(s)")
    if args.output:
        np.save(args.output, result.output)
    return 0


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        client = AttentionClient(args.server, timeout=args.timeout,
                                 max_message_bytes=args.max_message_bytes,
                                 **security_kwargs(args))
    except AttentionError as e:  # A malformed target.
        print(f"attention_client: --server: {e.details}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:  # A bad security flag: named in the message.
        print(f"attention_client: {e.strerror if isinstance(e, OSError) else e}",
              file=sys.stderr)
        return 2
    try:
        with client:
            if args.command == "health":
                if args.wait > 0 and not client.wait_ready(args.wait, args.service):
                    print(f"attention_client: not SERVING after {args.wait:g} s",
                          file=sys.stderr)
                status = client.health_status(args.service)
                print(status)
                return 0 if status == "SERVING" else 1
            if args.command == "models":
                for m in client.models():
                    versions = ", ".join(f"{v['version']} {v['state']}" for v in m["versions"])
                    print(f"{m['name']}{' *' if m['is_default'] else ''}: embed_dim "
                          f"{m['embed_dim']}, num_heads {m['num_heads']}, kdim {m['kdim']}, "
                          f"vdim {m['vdim']}, {m['compute_dtype']}, max_batch_size "
                          f"{m['batching']['max_batch_size']}, version {m['version']} "
                          f"({versions or 'no versions reported'})")
                print("(* = default model)")
                return 0
            if args.command == "repository":
                entries = client.repository_index(ready=args.ready)
                print(f"{'MODEL':<24} {'VERSION':>7}  {'STATE':<11}  REASON")
                for e in entries:
                    print(f"{e.name:<24} {e.version or '-':>7}  {e.state:<11}  {e.reason}")
                return 0
            if args.command == "load":
                versions = client.load_model(args.model_name)
                print(f"loaded {args.model_name}: serving version(s) "
                      f"{', '.join(map(str, versions))}")
                return 0
            if args.command == "unload":
                client.unload_model(args.model_name)
                print(f"unloaded {args.model_name}")
                return 0
            return _infer(client, args)
    except AttentionError as e:
        print(f"attention_client: {args.command} failed: {e}", file=sys.stderr)
        return 1
    except (TypeError, ValueError) as e:  # An argument the client cannot send: named.
        print(f"attention_client: {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
