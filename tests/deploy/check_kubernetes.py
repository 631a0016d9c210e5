#!/usr/bin/env python3
"""Checks deploy/kubernetes/ for what a platform team relies on (no cluster needed).

    /usr/bin/python3 tests/deploy/check_kubernetes.py [--repo DIR]

Every manifest parses; the Deployment has gRPC readiness/liveness probes on a numeric port,
resource requests and limits, a non-root read-only security context, and a termination grace
period above the server's drain timeout; the Service is headless and selects the pods; the HPA
targets the Deployment; the image's exposed ports match the Dockerfile.
"""
import argparse
import glob
import os
import re
import sys

import yaml


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    args = parser.parse_args()
    docs = {}
    for path in sorted(glob.glob(os.path.join(args.repo, "deploy", "kubernetes", "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                docs[doc["kind"]] = doc
    errors = []

    def check(condition, message):
        if not condition:
            errors.append(message)

    for kind in ("Deployment", "Service", "HorizontalPodAutoscaler", "PodMonitor"):
        check(kind in docs, f"missing a {kind}")
    dep = docs["Deployment"]
    labels = dep["spec"]["selector"]["matchLabels"]
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        port = container.get(probe, {}).get("grpc", {}).get("port")
        check(isinstance(port, int), f"{probe} must be a gRPC probe with a numeric port")
        check(port == 50051, f"{probe} port {port} is not the gRPC port 50051")
    res = container.get("resources", {})
    for part in ("requests", "limits"):
        check("cpu" in res.get(part, {}) and "memory" in res.get(part, {}),
              f"resources.{part} needs cpu and memory")
    sc = container.get("securityContext", {})
    check(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem must be true")
    check(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    check(pod.get("securityContext", {}).get("runAsNonRoot") is True, "runAsNonRoot must be true")
    drain = 30
    for arg in container.get("args", []):
        m = re.match(r"--drain_timeout_s=(\d+)", arg)
        if m:
            drain = int(m.group(1))
    check(pod.get("terminationGracePeriodSeconds", 30) > drain + 1,
          f"terminationGracePeriodSeconds must exceed the drain timeout {drain} s")
    annotations = dep["spec"]["template"]["metadata"].get("annotations", {})
    check(annotations.get("prometheus.io/port") == "9464", "scrape annotations need port 9464")
    svc = docs["Service"]
    check(svc["spec"].get("clusterIP") == "None", "the Service must be headless (clusterIP: None)")
    check(svc["spec"]["selector"] == labels, "the Service must select the Deployment's pods")
    hpa = docs["HorizontalPodAutoscaler"]
    check(hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"],
          "the HPA must target the Deployment")
    with open(os.path.join(args.repo, "docker", "Dockerfile")) as f:
        dockerfile = f.read()
    check(re.search(r"^EXPOSE 50051 9464$", dockerfile, re.M) is not None,
          "the Dockerfile must EXPOSE 50051 9464")
    check("USER 10001" in dockerfile, "the image must run as uid 10001 (runAsUser)")
    for e in errors:
        print("FAIL:", e)
    print(f"checked {len(docs)} manifests: {'ok' if not errors else f'{len(errors)} problem(s)'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
