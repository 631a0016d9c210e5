#!/usr/bin/env python3
"""One inference over the KServe v2 REST protocol with Python's standard library only.

Any Python 3 runs it (it needs no package), against a server's REST port
(build/bin/attention-server serves it on 8000):

    python3 client/python/examples/rest_infer.py --url http://localhost:8000 --model demo

Flags: --token TOKEN (a bearer token), --binary (Triton's binary tensor extension).

Sends a random query of shape [1, 4, E] (E read from the model's metadata) as JSON, or with
--binary as Triton's binary tensor extension (raw little-endian float32 after the JSON header,
Inference-Header-Content-Length), asks for the output as binary data in that case, and prints
the response's JSON part with the output's first values. Errors are an HTTP status and
{"error": "..."}, printed as they come.
"""
import argparse
import json
import random
import struct
import sys
import urllib.error
import urllib.request


def call(url, token, body=None, headers=None):
    request = urllib.request.Request(url, data=body, headers=dict(headers or {}))
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def infer(url, model, query, shape, token=None, binary=False):
    """Returns (status, response JSON, output floats or None)."""
    inputs = {"name": "query", "datatype": "FP32", "shape": shape}
    if binary:
        raw = struct.pack(f"<{len(query)}f", *query)
        inputs["parameters"] = {"binary_data_size": len(raw)}
        header = json.dumps({"inputs": [inputs],
                             "outputs": [{"name": "output",
                                          "parameters": {"binary_data": True}}]}).encode()
        body = header + raw
        headers = {"Content-Type": "application/octet-stream",
                   "Inference-Header-Content-Length": str(len(header))}
    else:
        inputs["data"] = query
        body = json.dumps({"inputs": [inputs]}).encode()
        headers = {"Content-Type": "application/json"}
    status, response_headers, payload = call(f"{url}/v2/models/{model}/infer", token, body,
                                             headers)
    length = {k.lower(): v for k, v in response_headers.items()}.get(
        "inference-header-content-length")
    if status != 200:
        return status, json.loads(payload), None
    if length is None:
        response = json.loads(payload)
        return status, response, response["outputs"][0]["data"]
    response = json.loads(payload[:int(length)])
    raw = payload[int(length):]
    return status, response, list(struct.unpack(f"<{len(raw) // 4}f", raw))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://localhost:8000")
    parser.add_argument("--model", default="demo")
    parser.add_argument("--token", default=None)
    parser.add_argument("--binary", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    status, _, payload = call(f"{args.url}/v2/models/{args.model}", args.token)
    if status != 200:
        print(f"metadata: HTTP {status}: {payload.decode()}", file=sys.stderr)
        return 1
    embed_dim = json.loads(payload)["inputs"][0]["shape"][-1]
    rng = random.Random(args.seed)
    shape = [1, 4, embed_dim]
    query = [rng.uniform(-1, 1) for _ in range(4 * embed_dim)]
    status, response, output = infer(args.url, args.model, query, shape, args.token, args.binary)
    if status != 200:
        print(f"infer: HTTP {status}: {response['error']}", file=sys.stderr)
        return 1
    print(json.dumps({"model_name": response["model_name"],
                      "shape": response["outputs"][0]["shape"],
                      "first": output[:4]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
