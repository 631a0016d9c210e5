"""Builds the attention-client package: pyproject.toml holds the metadata; this file adds the
one build step setuptools cannot express there, generating the gRPC stubs into the package.

    python3 -m venv --system-site-packages .venv          # Debian's grpcio, protobuf, numpy
    .venv/bin/pip install --no-build-isolation ./client/python

Stubs: proto/attention/v1/{attention,sessions}.proto and proto/inference/{grpc_predict_v2,
model_config}.proto become attention_client/_proto/... in the wheel, generated with `protoc`
and `grpc_python_plugin` (Debian: protobuf-compiler, protobuf-compiler-grpc, the same compiler
as the python3-protobuf runtime) when both are on PATH, else with grpc_tools.protoc (pip's
grpcio-tools). Their imports are rewritten from `attention.v1`/`inference` to
`attention_client._proto....`, so the package adds no top-level module besides its own.
The protos are read from ATTENTION_PROTO_DIR, else the repository's proto/ (../../proto), and
the version from the repository's CMakeLists.txt (project(... VERSION x.y.z)), so the package
is built from a checkout of the repository (there is no sdist).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PROTOS = ["attention/v1/attention.proto", "attention/v1/sessions.proto",
          "inference/grpc_predict_v2.proto", "inference/model_config.proto"]
PACKAGE = "attention_client._proto"


def project_version():
    """x.y.z of `project(attention_service VERSION x.y.z ...)` in the top CMakeLists.txt."""
    path = os.path.join(REPO, "CMakeLists.txt")
    try:
        with open(path) as f:
            match = re.search(r"project\(\s*\w+\s+VERSION\s+([0-9][0-9.]*)", f.read())
    except OSError as e:
        sys.exit(f"attention-client: cannot read {path} for the version ({e.strerror}): build "
                 f"the package from a checkout of the repository")
    if not match:
        sys.exit(f"attention-client: no 'project(... VERSION x.y.z)' in {path}")
    return match.group(1)


def proto_dir():
    directory = os.environ.get("ATTENTION_PROTO_DIR", os.path.join(REPO, "proto"))
    missing = [p for p in PROTOS if not os.path.isfile(os.path.join(directory, p))]
    if missing:
        sys.exit(f"attention-client: {', '.join(missing)} not found in {directory} (set "
                 f"ATTENTION_PROTO_DIR to the repository's proto/ folder)")
    return directory


def protoc_command(out):
    """The command that generates Python messages and gRPC stubs into `out`."""
    protoc, plugin = shutil.which("protoc"), shutil.which("grpc_python_plugin")
    if protoc and plugin:
        return [protoc, f"--plugin=protoc-gen-grpc={plugin}", f"--python_out={out}",
                f"--grpc_out={out}"]
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        sys.exit("attention-client: generating the gRPC stubs needs protoc and "
                 "grpc_python_plugin (Debian: apt-get install protobuf-compiler "
                 "protobuf-compiler-grpc) or grpc_tools (pip install grpcio-tools)")
    return [sys.executable, "-m", "grpc_tools.protoc", f"--python_out={out}",
            f"--grpc_python_out={out}"]


def rewrite(text, module):
    """Imports of the generated packages made relative to attention_client._proto."""
    text = re.sub(r"^from (attention\.v1|inference) import ", rf"from {PACKAGE}.\1 import ",
                  text, flags=re.M)
    return text.replace(f"(DESCRIPTOR, '{module}', globals())",
                        f"(DESCRIPTOR, '{PACKAGE}.{module}', globals())")


def generate_stubs(package_dir):
    """Writes attention_client/_proto/ (messages, stubs, __init__.py files) under package_dir."""
    protos = proto_dir()
    target = os.path.join(package_dir, "_proto")
    with tempfile.TemporaryDirectory(prefix="attention-stubs-") as out:
        command = protoc_command(out) + [f"-I{protos}"] + PROTOS
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"attention-client: {' '.join(command)} failed:\n{result.stderr}")
        shutil.rmtree(target, ignore_errors=True)
        for folder in ("", "attention", "attention/v1", "inference"):
            os.makedirs(os.path.join(target, folder), exist_ok=True)
            with open(os.path.join(target, folder, "__init__.py"), "w") as f:
                f.write('"""Generated from proto/ when the package was built."""\n'
                        if not folder else "")
        for root, _, files in os.walk(out):
            for name in files:
                if not name.endswith(".py"):
                    continue
                relative = os.path.relpath(os.path.join(root, name), out)
                module = relative[:-3].replace(os.sep, ".")
                with open(os.path.join(out, relative)) as f:
                    text = rewrite(f.read(), module)
                with open(os.path.join(target, relative), "w") as f:
                    f.write(text)


class BuildPyWithStubs(build_py):
    """build_py that also generates the stubs and _version.py into the built package."""

    def run(self):
        super().run()
        package_dir = os.path.join(self.build_lib, "attention_client")
        generate_stubs(package_dir)
        with open(os.path.join(package_dir, "_version.py"), "w") as f:
            f.write(f'__version__ = "{self.distribution.get_version()}"\n')


setup(version=project_version(), cmdclass={"build_py": BuildPyWithStubs})
