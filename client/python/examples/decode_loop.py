#!/usr/bin/env python3
"""A decode loop over a session: prefill a prompt, then step one token at a time.

Run from the repository's root against a server (build/bin/attention-server), with the Python
package installed into a virtual environment that sees Debian's grpcio and numpy; the first
two commands once (docs/clients/python.md#install):

    /usr/bin/python3 -m venv --system-site-packages ~/attention-venv
    ~/attention-venv/bin/pip install ./client/python
    ~/attention-venv/bin/python client/python/examples/decode_loop.py \\
        --server localhost:50051 --check

Flags: --model NAME (default: the server's), --prompt 32, --steps 16, --check; TLS and tokens
as attention-client's: --tls or --tls_ca_file ca.pem, --tls_cert_file c.pem --tls_key_file
c.key, --tls_server_name NAME, --token_file F (default: $ATTENTION_TOKEN).

An autoregressive decoder calls its attention layer once per new token over every token so far.
With a session the server keeps the keys and values, and each step sends only the new token:
1. Asks the model's embed_dim (ListModels).
2. Creates a self-attention session (replay=True: a ReplayingSession, which re-creates a lost
   session, e.g. expired or on a replica that went away, and re-sends the tokens so far).
3. Prefills: appends the prompt's tokens (P, E), in chunks of at most max_batch_tokens.
4. Steps: appends one token (1, E) per step and gets its output row. Here the next token is the
   last output row rescaled to unit RMS, standing in for the rest of a decoder (its other
   layers, sampling, the embedding of the sampled token).
5. Prints each step's latency (the client's round trip, the server's queue and compute time)
   and a summary, and closes the session.
With --check it also compares every output row with one stateless infer(is_causal=True) over
the whole sequence. Exits non-zero on an error or a mismatch.
"""
import argparse
import sys
import time

import numpy as np

try:
    from attention_client import (AttentionClient, AttentionError, add_security_flags,
                                  security_kwargs)
except ImportError as e:  # Not the environment the docstring names: say which it is.
    sys.exit(f"decode_loop: {e}.\nRun it as its docstring says, with the attention-client "
             f"package installed:\n" + __doc__[__doc__.index("    /usr/bin/python3"):
                                                __doc__.index("Flags:")].rstrip())


def percentile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1) + 0.5))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="localhost:50051", help="gRPC target")
    parser.add_argument("--model", default="", help="model name (default: the server's)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens (prefill)")
    parser.add_argument("--steps", type=int, default=16, help="decode steps, one token each")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true",
                        help="compare with one stateless infer(is_causal=True)")
    add_security_flags(parser)
    args = parser.parse_args()
    if args.prompt < 1 or args.steps < 0:
        parser.error("--prompt must be >= 1 and --steps >= 0")

    try:
        client = AttentionClient(args.server, timeout=30, **security_kwargs(args))
    except (ValueError, OSError) as e:  # A bad flag: named in the message.
        parser.error(e.strerror if isinstance(e, OSError) else str(e))
    with client:
        models = client.models()
        model = next((m for m in models if m["name"] == args.model
                      or (not args.model and m["is_default"])), None)
        if model is None:
            print(f"decode_loop: model '{args.model}' is not served", file=sys.stderr)
            return 1
        e = model["embed_dim"]
        chunk = max(1, model["batching"]["max_batch_tokens"])
        prompt = np.random.default_rng(args.seed).standard_normal((args.prompt, e),
                                                                   dtype=np.float32)
        sent, outputs = [prompt], []

        with client.session(model=args.model, replay=True) as session:
            print(f"model {model['name']}: embed_dim {e}, session {session.session_id}")
            start = time.perf_counter()
            for at in range(0, args.prompt, chunk):
                result = session.append(prompt[at:at + chunk])
                outputs.append(result.output)
            print(f"prefill {args.prompt} tokens: {(time.perf_counter() - start) * 1e3:.2f} ms "
                  f"(last append: queue {result.queue_us} us, compute {result.compute_us} us)")

            step_ms = []
            for step in range(1, args.steps + 1):
                last = outputs[-1][-1]
                rms = max(float(np.sqrt(np.mean(last * last))), 1e-6)
                token = (last / rms).astype(np.float32)[None, :]  # (1, E)
                start = time.perf_counter()
                result = session.append(token)
                step_ms.append((time.perf_counter() - start) * 1e3)
                sent.append(token)
                outputs.append(result.output)
                print(f"step {step:3d}: length {result.length:4d}  {step_ms[-1]:7.3f} ms "
                      f"(queue {result.queue_us} us, compute {result.compute_us} us, "
                      f"batch {result.batch_requests})")
            if step_ms:
                ms = sorted(step_ms)
                print(f"decode {len(ms)} steps: p50 {percentile(ms, 0.5):.3f} ms, "
                      f"p90 {percentile(ms, 0.9):.3f} ms, max {ms[-1]:.3f} ms; "
                      f"final length {session.length}, recoveries {session.recoveries}")
            print(f"closed session: {session.close()} bytes freed")

        if args.check:
            got = np.concatenate(outputs)
            want = client.infer(np.concatenate(sent), is_causal=True, model=args.model,
                                output_dtype="float32").output
            # float32 layers agree to float rounding; bfloat16 ones to bfloat16's.
            tol = 5e-2 if model["compute_dtype"] == "DATA_TYPE_BFLOAT16" else 1e-4
            diff = np.abs(got.astype(np.float32) - want)
            ok = got.shape == want.shape and bool(np.all(diff <= tol + tol * np.abs(want)))
            print(f"check vs one stateless infer(is_causal=True) over {len(want)} tokens: "
                  f"max |diff| {diff.max():.3g}: {'MATCH' if ok else 'MISMATCH'}")
            return 0 if ok else 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AttentionError as e:
        print(f"decode_loop: {e}", file=sys.stderr)
        sys.exit(1)
