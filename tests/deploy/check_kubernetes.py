#!/usr/bin/env python3
"""Checks deploy/kubernetes/ for what a platform team relies on (no cluster needed).

    /usr/bin/python3 tests/deploy/check_kubernetes.py [--repo DIR]

Every manifest parses; the Deployment has readiness/liveness probes (gRPC on the numeric port
in plaintext, the image's TLS health check with TLS on), TLS files and tokens mounted read-only
from Secrets, a NetworkPolicy that limits the plaintext metrics port,
resource requests and limits, a non-root read-only security context, and a termination grace
period above the server's drain timeout; what the server's flags admit fits the memory limit; the
Service is headless and selects the pods; the HPA
targets the Deployment; the image's exposed ports match the Dockerfile.
"""
import argparse
import glob
import os
import re
import sys

import yaml


def memory_bytes(quantity):
    """A Kubernetes memory quantity ("3Gi", "512Mi", "2G", "1000") in bytes."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
             "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    m = re.fullmatch(r"(\d+)([KMGT]i?)?", str(quantity))
    if not m:
        return 0
    return int(m.group(1)) * units.get(m.group(2) or "", 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    args = parser.parse_args()
    docs, every = {}, []
    for path in sorted(glob.glob(os.path.join(args.repo, "deploy", "kubernetes", "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                docs.setdefault(doc["kind"], doc)
                every.append(doc)
    services = {d["metadata"]["name"]: d for d in every if d["kind"] == "Service"}
    errors = []

    def check(condition, message):
        if not condition:
            errors.append(message)
        return condition

    for kind in ("Deployment", "Service", "HorizontalPodAutoscaler", "PodMonitor",
                 "NetworkPolicy"):
        check(kind in docs, f"missing a {kind}")
    dep = next((d for d in every if d["kind"] == "Deployment" and
                d["metadata"]["name"] == "attention-server"), docs["Deployment"])
    labels = dep["spec"]["selector"]["matchLabels"]
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    flags = {}
    for arg in container.get("args", []):
        m = re.match(r"--(\w+)=(.*)", arg)
        if m:
            flags[m.group(1)] = m.group(2)
    tls = "tls_cert_file" in flags
    env = {e["name"]: e for e in container.get("env", [])}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        spec = container.get(probe, {})
        if tls:
            # The kubelet's gRPC probe cannot speak TLS.
            check(spec.get("exec", {}).get("command") == ["/usr/local/bin/healthcheck.sh"],
                  f"{probe}: with TLS on it must run /usr/local/bin/healthcheck.sh")
        else:
            port = spec.get("grpc", {}).get("port")
            check(isinstance(port, int), f"{probe} must be a gRPC probe with a numeric port")
            check(port == 50051, f"{probe} port {port} is not the gRPC port 50051")
    # Files the server reads must come from read-only Secret volumes.
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = [(m["mountPath"], volumes.get(m["name"], {}), m.get("readOnly"))
              for m in container.get("volumeMounts", [])]

    def secret_mount(path, what):
        for mount_path, volume, read_only in mounts:
            if path.startswith(mount_path.rstrip("/") + "/"):
                check("secret" in volume, f"{what} ({path}) must be mounted from a Secret")
                check(read_only is True, f"{what} ({path}) must be mounted readOnly")
                return
        errors.append(f"{what} ({path}) is not under any volume mount")

    for flag in ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "auth_tokens_file"):
        if flag in flags:
            secret_mount(flags[flag], "--" + flag)
    if tls:
        ca = env.get("ATTENTION_TLS_CA_FILE", {}).get("value", "")
        check(ca != "", "ATTENTION_TLS_CA_FILE must tell the health check which CA to trust")
        if ca:
            secret_mount(ca, "ATTENTION_TLS_CA_FILE")
    check("auth_tokens_file" in flags, "--auth_tokens_file must be set (bearer tokens)")
    check("max_inflight_bytes" in flags, "--max_inflight_bytes must be set for the pod's memory")
    netpol = docs["NetworkPolicy"]
    check(netpol["spec"]["podSelector"].get("matchLabels") == labels,
          "the NetworkPolicy must select the Deployment's pods")
    for rule in netpol["spec"].get("ingress", []):
        ports = [p.get("port") for p in rule.get("ports", [])]
        if 9464 in ports or "metrics" in ports:
            check(bool(rule.get("from")), "the metrics port (9464) must be limited to a 'from'")
    res = container.get("resources", {})
    for part in ("requests", "limits"):
        check("cpu" in res.get(part, {}) and "memory" in res.get(part, {}),
              f"resources.{part} needs cpu and memory")
    sc = container.get("securityContext", {})
    check(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem must be true")
    check(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    check(pod.get("securityContext", {}).get("runAsNonRoot") is True, "runAsNonRoot must be true")
    drain = int(flags.get("drain_timeout_s", 30))
    # What the server may admit must fit the memory limit with a 20% margin:
    # queued requests (max_queue_size x max_message_bytes) three times over
    # (the messages, a batch's padded float32 copies, the encoded responses),
    # one batch weights buffer (512 MiB), the sessions' caches
    # (--session_memory_bytes; unset, counted here as a quarter of the limit,
    # more than its default of 15% of what the baseline leaves of 85% of the
    # limit), and the process (model, runtime).
    # And the model versions resident at once (--max_model_bytes) when models
    # come from a repository.
    queue = int(flags.get("max_queue_size", 1024))
    message = int(flags.get("max_message_bytes", 64 << 20))
    limit = memory_bytes(res.get("limits", {}).get("memory", "0"))
    sessions = int(flags.get("session_memory_bytes", limit // 4))
    models = int(flags.get("max_model_bytes", 0))
    admitted = 3 * queue * message + (512 << 20) + (128 << 20) + sessions + models
    check(admitted <= 0.8 * limit,
          f"the server admits ~{admitted >> 20} MiB (max_queue_size {queue} x max_message_bytes "
          f"{message} x 3 + 640 MiB + session memory {sessions >> 20} MiB + max_model_bytes "
          f"{models >> 20} MiB), over 80% of the memory limit {limit >> 20} MiB: set "
          "--max_queue_size, --max_message_bytes, --session_memory_bytes and --max_model_bytes")
    # The model repository: a claim every replica mounts whole and read-only,
    # polled, with the versions' memory bounded; and something that writes it.
    if "model_repository" in flags:
        repo = flags["model_repository"].rstrip("/")
        mount = [m for m in container.get("volumeMounts", []) if m["mountPath"].rstrip("/") ==
                 repo]
        claim = {}
        if check(len(mount) == 1, f"--model_repository {repo} must be a volume mount"):
            check("subPath" not in mount[0],
                  "the model repository must not be a subPath mount (it never updates)")
            check(mount[0].get("readOnly") is True, "the model repository must be mounted readOnly")
            claim = volumes.get(mount[0]["name"], {}).get("persistentVolumeClaim", {})
            check(bool(claim), "the model repository must come from a PersistentVolumeClaim "
                               "(a ConfigMap holds at most 1 MiB)")
        check(flags.get("model_control") == "poll",
              "--model_control=poll: replicas pick up new versions written into the claim")
        check(models > 0, "--max_model_bytes must bound the resident versions (old and new)")
        claims = {d["metadata"]["name"]: d for d in every if d["kind"] == "PersistentVolumeClaim"}
        pvc = claims.get(claim.get("claimName"))
        if check(pvc is not None, f"no PersistentVolumeClaim {claim.get('claimName')!r} here"):
            modes = pvc["spec"].get("accessModes", [])
            check(bool({"ReadWriteMany", "ReadOnlyMany"} & set(modes)),
                  f"the claim's accessModes {modes} must let replicas on several nodes mount it "
                  "(ReadWriteMany)")
        writers = [d for d in every if d["kind"] in ("Deployment", "Pod", "Job") and d is not dep
                   and any(v.get("persistentVolumeClaim", {}).get("claimName") ==
                           claim.get("claimName")
                           for v in (d["spec"].get("template", d)["spec"].get("volumes", [])))]
        check(len(writers) >= 1, "something must write new versions into the claim (an "
                                 "uploader pod or a sync sidecar)")
        for w in writers:
            spec = w["spec"].get("template", w)["spec"]
            check(spec.get("securityContext", {}).get("runAsUser") ==
                  pod.get("securityContext", {}).get("runAsUser"),
                  f"{w['metadata']['name']} must write as the server's uid (it reads the files)")
    check(flags.get("advertise_address", "").startswith("$(POD_IP):") and
          env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") ==
          "status.podIP",
          "--advertise_address must be $(POD_IP):50051 with POD_IP from status.podIP, so that "
          "session ids name the pod holding them")
    check(flags.get("max_connection_age_s", "60") not in ("0", "0.0"),
          "--max_connection_age_s must stay on: clients re-resolve the headless Service with it")
    check(pod.get("terminationGracePeriodSeconds", 30) > drain + 1,
          f"terminationGracePeriodSeconds must exceed the drain timeout {drain} s")
    annotations = dep["spec"]["template"]["metadata"].get("annotations", {})
    check(annotations.get("prometheus.io/port") == "9464", "scrape annotations need port 9464")
    svc = services.get("attention-server", docs["Service"])
    check(svc["spec"].get("clusterIP") == "None", "the Service must be headless (clusterIP: None)")
    check(svc["spec"]["selector"] == labels, "the Service must select the Deployment's pods")
    # Sessions through Istio: a DestinationRule hashing x-attention-session on a Service that is
    # not headless (Istio does not balance a headless Service's traffic) over the same pods.
    rules = [d for d in every if d["kind"] == "DestinationRule"]
    check(len(rules) == 1, f"expected one Istio DestinationRule, got {len(rules)}")
    for rule in rules:
        check(rule.get("apiVersion", "").startswith("networking.istio.io/"),
              "the DestinationRule must be networking.istio.io's")
        host = rule["spec"].get("host", "")
        target = services.get(host.split(".")[0])
        if check(target is not None, f"the DestinationRule's host {host!r} is no Service here"):
            check(target["spec"].get("clusterIP") != "None",
                  f"the DestinationRule's Service {host!r} must not be headless")
            check(target["spec"].get("selector") == labels,
                  f"the DestinationRule's Service {host!r} must select the Deployment's pods")
            check(any(p.get("name") == "grpc" or p.get("appProtocol") == "grpc"
                      for p in target["spec"].get("ports", [])),
                  f"the Service {host!r} must declare its port as grpc (HTTP/2 to the pods)")
        hashing = rule["spec"].get("trafficPolicy", {}).get("loadBalancer", {}).get(
            "consistentHash", {})
        check(hashing.get("httpHeaderName") == "x-attention-session",
              "the DestinationRule must hash trafficPolicy.loadBalancer.consistentHash."
              "httpHeaderName: x-attention-session")
    for doc in every:
        annotations = doc.get("metadata", {}).get("annotations", {}) or {}
        check(not any(k.endswith("upstream-hash-by") for k in annotations),
              f"{doc['kind']} {doc['metadata']['name']}: not ingress-nginx's upstream-hash-by "
              "(it hashes a missing header as '', sending all stateless calls to one pod)")
    hpa = docs["HorizontalPodAutoscaler"]
    check(hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"],
          "the HPA must target the Deployment")
    with open(os.path.join(args.repo, "docker", "Dockerfile")) as f:
        dockerfile = f.read()
    check(re.search(r"^EXPOSE 50051 8000 9464$", dockerfile, re.M) is not None,
          "the Dockerfile must EXPOSE 50051 8000 9464")
    # REST: the container port named http is --http_port, the Service and
    # the NetworkPolicy expose it.
    http = int(flags.get("http_port", "8000"))
    check(http > 0 and {"name": "http", "containerPort": http} in container.get("ports", []),
          f"the container must declare port 'http' = --http_port ({http})")
    check(any(p.get("name") == "http" and p.get("port") == http and p.get("targetPort") == "http"
              for p in svc["spec"].get("ports", [])),
          f"the Service must expose REST as port 'http' ({http})")
    open_ports = [p.get("port") for rule in docs["NetworkPolicy"]["spec"].get("ingress", [])
                  if not rule.get("from") for p in rule.get("ports", [])]
    check(http in open_ports, f"the NetworkPolicy must admit the REST port {http}")
    check("USER 10001" in dockerfile, "the image must run as uid 10001 (runAsUser)")
    for e in errors:
        print("FAIL:", e)
    print(f"checked {len(every)} manifests: {'ok' if not errors else f'{len(errors)} problem(s)'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
