#!/usr/bin/env python3
"""Checks deploy/kserve/inferenceservice{,-rest}.yaml for what KServe and Knative need (no cluster).

inferenceservice-rest.yaml is the same predictor serving the KServe v2 REST protocol: its one
port is http1 (--http_port, 8000) and its probes are HTTP GETs of /v2/health/ready and
/v2/health/live (Knative routes a single port per revision, so gRPC and REST are two
InferenceServices). The rest of this description holds for both, with their own port.


    /usr/bin/python3 tests/deploy/check_kserve.py [--repo DIR]

The manifest is one serving.kserve.io/v1beta1 InferenceService with a custom predictor: one
container (kserve-container) running the same image as deploy/kubernetes/deployment.yaml; the
Open Inference Protocol declared as v2 (PROTOCOL=v2: a custom predictor's protocolVersion; the
protocolVersion field itself belongs to built-in predictors and is refused here); a single
container port, named h2c, 50051/TCP, the server's --port, so that Knative routes HTTP/2
cleartext (gRPC) to it; the server in plaintext (queue-proxy speaks h2c); --model_repository
served from where STORAGE_URI lands (/mnt/models); readiness, liveness and startup probes
(grpc.health.v1 on 50051); resource requests and limits, with what the server may admit
fitting the memory limit (the same sum as check_kubernetes.py); a non-root, read-only container
security context (no pod-level one, which Knative refuses by default); the token file from a
read-only Secret; a request timeout (Knative's termination grace period) above the drain timeout;
the metrics port announced through KServe's Prometheus annotations; at least one replica; and
(gRPC) comments documenting the x-attention-session header and expected_length for sequences.
"""
import argparse
import os
import re
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_kubernetes import memory_bytes  # noqa: E402


def check_isvc(repo, name, rest):
    """Checks deploy/kserve/<name>: gRPC (h2c, 50051) or, with `rest`, REST (http1, 8000)."""
    errors = []

    def check(condition, message):
        if not condition:
            errors.append(f"{name}: {message}")
        return condition

    args = argparse.Namespace(repo=repo)
    with open(os.path.join(args.repo, "deploy", "kserve", name)) as f:
        text = f.read()
    docs = [d for d in yaml.safe_load_all(text) if d]
    if not rest:
        # Its comments are the manifest's documentation of sequences through KServe: the
        # routing header, the expected_length parameter, and how to run more than one replica.
        for needle in ("x-attention-session: <sequence_id>", "expected_length",
                       "headers={\"x-attention-session\"", "RawDeployment",
                       "istio-destinationrule.yaml"):
            check(needle in text, f"the manifest's comments must document {needle!r}")
    with open(os.path.join(args.repo, "deploy", "kubernetes", "deployment.yaml")) as f:
        deployment = next(d for d in yaml.safe_load_all(f) if d and d["kind"] == "Deployment")
    if not check(len(docs) == 1, f"expected one document, got {len(docs)}"):
        docs = docs[:1]
    isvc = docs[0]
    check(isvc.get("apiVersion") == "serving.kserve.io/v1beta1",
          f"apiVersion must be serving.kserve.io/v1beta1, got {isvc.get('apiVersion')!r}")
    check(isvc.get("kind") == "InferenceService",
          f"kind must be InferenceService, got {isvc.get('kind')!r}")
    name = isvc.get("metadata", {}).get("name", "")
    check(re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) is not None,
          f"metadata.name {name!r} is not a valid InferenceService name")
    predictor = isvc.get("spec", {}).get("predictor", {})
    containers = predictor.get("containers", [])
    check(len(containers) == 1, f"the custom predictor needs one container, got {len(containers)}")
    container = containers[0] if containers else {}
    check(container.get("name") == "kserve-container",
          "the predictor container must be named kserve-container")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    check(container.get("image") == image,
          f"image {container.get('image')!r} differs from the Deployment's {image!r}")

    # The protocol: v2, the way KServe reads it for a custom predictor.
    env = {e["name"]: e for e in container.get("env", [])}
    check(env.get("PROTOCOL", {}).get("value") == "v2",
          "env PROTOCOL must be v2 (the custom predictor's protocolVersion: the Open "
          "Inference Protocol)")
    check("protocolVersion" not in predictor and "protocolVersion" not in container,
          "protocolVersion is not a field of a custom predictor (use env PROTOCOL)")
    check("PORT" not in env, "PORT is reserved by Knative")

    # The one port: h2c on 50051, the server's gRPC port, in plaintext.
    flags = {}
    for arg in container.get("args", []):
        m = re.match(r"--(\w+)=(.*)", arg)
        if m:
            flags[m.group(1)] = m.group(2)
    ports = [p for c in containers for p in c.get("ports", [])]
    check(len(ports) == 1, f"Knative allows one container port, got {len(ports)}")
    if ports and rest:
        # REST: HTTP/1.1 to the server's --http_port; gRPC stays reachable
        # only inside the pod (Knative routes one port).
        port = ports[0]
        check(port.get("name") == "http1",
              f"the REST port must be named http1, got {port.get('name')!r}")
        check(port.get("containerPort") == int(flags.get("http_port", 8000)),
              f"the http1 port {port.get('containerPort')} is not --http_port")
    elif ports:
        port = ports[0]
        check(port.get("name") == "h2c",
              f"the port must be named h2c (gRPC over HTTP/2 cleartext), got {port.get('name')!r}")
        check(port.get("containerPort") == 50051,
              f"the h2c port must be 50051, got {port.get('containerPort')!r}")
        check(port.get("protocol", "TCP") == "TCP", "the h2c port's protocol must be TCP")
        check(int(flags.get("port", 50051)) == port.get("containerPort"),
              f"--port={flags.get('port')} is not the h2c port")
    for flag in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
        check(flag not in flags, f"--{flag}: Knative's queue-proxy speaks h2c (plaintext) to the "
                                 "container")

    # Models.
    repository = flags.get("model_repository", "")
    check(repository != "", "--model_repository must be set")
    if "STORAGE_URI" in env:
        check(repository.rstrip("/") == "/mnt/models",
              "with STORAGE_URI, --model_repository must be /mnt/models (where KServe puts it)")

    # Probes.
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        spec = container.get(probe)
        if not check(spec is not None, f"{probe} missing"):
            continue
        if rest:
            path = "/v2/health/ready" if probe == "readinessProbe" else "/v2/health/live"
            get = spec.get("httpGet", {})
            check(get.get("path") == path and get.get("port") == int(flags.get("http_port", 8000)),
                  f"{probe} must be an HTTP GET of {path} on --http_port")
        else:
            check(spec.get("grpc", {}).get("port") == 50051,
                  f"{probe} must be a gRPC health probe on 50051")

    # Resources, and what the server admits within the memory limit.
    res = container.get("resources", {})
    for part in ("requests", "limits"):
        check("cpu" in res.get(part, {}) and "memory" in res.get(part, {}),
              f"resources.{part} needs cpu and memory")
    check("max_inflight_bytes" in flags, "--max_inflight_bytes must be set for the pod's memory")
    queue = int(flags.get("max_queue_size", 1024))
    message = int(flags.get("max_message_bytes", 64 << 20))
    limit = memory_bytes(res.get("limits", {}).get("memory", "0"))
    sessions = int(flags.get("session_memory_bytes", limit // 4))
    admitted = 3 * queue * message + (512 << 20) + (128 << 20) + sessions
    check(admitted <= 0.8 * limit,
          f"the server admits ~{admitted >> 20} MiB, over 80% of the memory limit "
          f"{limit >> 20} MiB (see check_kubernetes.py)")

    # Security context, on the container.
    sc = container.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True, "runAsNonRoot must be true")
    check(sc.get("runAsUser") == 10001, "runAsUser must be the image's uid 10001")
    check(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem must be true")
    check(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    check("ALL" in sc.get("capabilities", {}).get("drop", []), "capabilities must drop ALL")
    check("securityContext" not in predictor,
          "a pod-level securityContext needs Knative's kubernetes.podspec-securitycontext flag: "
          "keep it on the container")
    with open(os.path.join(args.repo, "docker", "Dockerfile")) as f:
        check("USER 10001" in f.read(), "the image must run as uid 10001")

    # The token file from a read-only Secret, readable by uid 10001.
    volumes = {v["name"]: v for v in predictor.get("volumes", [])}
    if "auth_tokens_file" in flags:
        path = flags["auth_tokens_file"]
        mounts = [m for m in container.get("volumeMounts", [])
                  if path.startswith(m["mountPath"].rstrip("/") + "/")]
        if check(len(mounts) == 1, f"--auth_tokens_file ({path}) is not under one volume mount"):
            volume = volumes.get(mounts[0]["name"], {})
            check("secret" in volume, "--auth_tokens_file must come from a Secret")
            check(mounts[0].get("readOnly") is True, "the Secret must be mounted readOnly")
            mode = volume.get("secret", {}).get("defaultMode", 0o644)
            check(mode & 0o004, "without a pod fsGroup the Secret's files must be world-readable "
                                "(uid 10001 reads them)")

    # Request timeout (Knative's termination grace period) above the drain.
    drain = int(flags.get("drain_timeout_s", 30))
    check(predictor.get("timeout", 300) > drain + 1,
          f"timeout must exceed --drain_timeout_s {drain} (Knative's grace period follows it)")
    check(predictor.get("minReplicas", 1) >= 1,
          "minReplicas must be at least 1 (no scale to zero: model load, sequences)")

    # Metrics: the port Knative cannot declare, announced to KServe.
    annotations = isvc.get("metadata", {}).get("annotations", {})
    check(annotations.get("serving.kserve.io/enable-prometheus-scraping") == "true",
          "serving.kserve.io/enable-prometheus-scraping must be \"true\"")
    check(annotations.get("prometheus.kserve.io/port") == flags.get("metrics_port", "9464"),
          "prometheus.kserve.io/port must be the metrics port (9464)")
    check(annotations.get("prometheus.kserve.io/path") == "/metrics",
          "prometheus.kserve.io/path must be /metrics")

    print(f"checked deploy/kserve/{name}: {'ok' if not errors else f'{len(errors)} problem(s)'}")
    return errors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    args = parser.parse_args()
    errors = (check_isvc(args.repo, "inferenceservice.yaml", rest=False) +
              check_isvc(args.repo, "inferenceservice-rest.yaml", rest=True))
    for e in errors:
        print("FAIL:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
