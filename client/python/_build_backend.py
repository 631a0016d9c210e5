"""The attention-client package's build backend (PEP 517, named in pyproject.toml): builds its
wheel with the Python standard library alone, so `pip install ./client/python` works with any
Python >= 3.9 and pip, offline, with or without build isolation: no setuptools, no `wheel`
package (setuptools before 70.1 cannot build a wheel without it: "invalid command
'bdist_wheel'").

The wheel holds attention_client/ (the sources, py.typed, _version.py with the project's
version) and attention_client/_proto/, the gRPC stubs generated from the repository's proto/:
proto/attention/v1/{attention,sessions}.proto and proto/inference/{grpc_predict_v2,
model_config}.proto, with `protoc` and `grpc_python_plugin` (Debian: protobuf-compiler,
protobuf-compiler-grpc, the same compiler as the python3-protobuf runtime) when both are on
PATH, else with grpc_tools.protoc (pip's grpcio-tools, then asked for as a build requirement).
Their imports are rewritten from `attention.v1`/`inference` to `attention_client._proto....`,
so the package adds no top-level module besides its own. The protos are read from
ATTENTION_PROTO_DIR, else the repository's proto/ (../../proto), and the version from the
repository's CMakeLists.txt (project(... VERSION x.y.z)), so the package is built from a
checkout of the repository (there is no sdist). The package's metadata is below (METADATA).
"""
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
NAME = "attention_client"  # The distribution's normalized name, the wheel's and the package's.
PROTOS = ["attention/v1/attention.proto", "attention/v1/sessions.proto",
          "inference/grpc_predict_v2.proto", "inference/model_config.proto"]
PACKAGE = "attention_client._proto"
# Core metadata (PEP 566/643). The runtime needs grpcio, protobuf and numpy (Debian 12:
# python3-grpcio, python3-protobuf, python3-numpy, seen by a venv made with
# --system-site-packages); attention_client.export and attention-export need PyTorch too.
METADATA = """Metadata-Version: 2.1
Name: attention-client
Version: {version}
Summary: Client of attention-service: torch.nn.MultiheadAttention inference over gRPC
Requires-Python: >=3.9
Requires-Dist: grpcio>=1.51
Requires-Dist: protobuf>=3.21
Requires-Dist: numpy>=1.21
Provides-Extra: export
Requires-Dist: torch; extra == "export"
Classifier: Programming Language :: Python :: 3
Classifier: Typing :: Typed
Description-Content-Type: text/markdown

"""
ENTRY_POINTS = """[console_scripts]
attention-export = attention_client.export:main
"""


def _fail(message):
    """Ends the build with `message` (pip shows a backend's stderr and exit code)."""
    sys.exit(f"attention-client: {message}")


def project_version():
    """x.y.z of `project(attention_service VERSION x.y.z ...)` in the top CMakeLists.txt."""
    path = os.path.join(REPO, "CMakeLists.txt")
    try:
        with open(path) as f:
            match = re.search(r"project\(\s*\w+\s+VERSION\s+([0-9][0-9.]*)", f.read())
    except OSError as e:
        _fail(f"cannot read {path} for the version ({e.strerror}): build the package from a "
              f"checkout of the repository")
    if not match:
        _fail(f"no 'project(... VERSION x.y.z)' in {path}")
    return match.group(1)


def proto_dir():
    directory = os.environ.get("ATTENTION_PROTO_DIR", os.path.join(REPO, "proto"))
    missing = [p for p in PROTOS if not os.path.isfile(os.path.join(directory, p))]
    if missing:
        _fail(f"{', '.join(missing)} not found in {directory} (set ATTENTION_PROTO_DIR to the "
              f"repository's proto/ folder)")
    return directory


def _native_compiler():
    protoc, plugin = shutil.which("protoc"), shutil.which("grpc_python_plugin")
    return (protoc, plugin) if protoc and plugin else None


def _has_grpc_tools():
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        return False
    return True


def protoc_command(out):
    """The command that generates Python messages and gRPC stubs into `out`."""
    native = _native_compiler()
    if native:
        return [native[0], f"--plugin=protoc-gen-grpc={native[1]}", f"--python_out={out}",
                f"--grpc_out={out}"]
    if not _has_grpc_tools():
        _fail("generating the gRPC stubs needs protoc and grpc_python_plugin on PATH (Debian: "
              "apt-get install protobuf-compiler protobuf-compiler-grpc) or grpc_tools (pip "
              "install grpcio-tools)")
    return [sys.executable, "-m", "grpc_tools.protoc", f"--python_out={out}",
            f"--grpc_python_out={out}"]


def rewrite(text, module):
    """Imports of the generated packages made relative to attention_client._proto."""
    text = re.sub(r"^from (attention\.v1|inference) import ", rf"from {PACKAGE}.\1 import ",
                  text, flags=re.M)
    return text.replace(f"(DESCRIPTOR, '{module}', globals())",
                        f"(DESCRIPTOR, '{PACKAGE}.{module}', globals())")


def generated_stubs():
    """{path in the wheel: bytes} of attention_client/_proto/ (messages, stubs, __init__.py)."""
    files = {}
    with tempfile.TemporaryDirectory(prefix="attention-stubs-") as out:
        command = protoc_command(out) + [f"-I{proto_dir()}"] + PROTOS
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            _fail(f"{' '.join(command)} failed:\n{result.stderr}")
        for folder in ("", "attention", "attention/v1", "inference"):
            files[f"{NAME}/_proto/{folder}/__init__.py".replace("//", "/")] = (
                b'"""Generated from proto/ when the package was built."""\n' if not folder
                else b"")
        for root, _, names in os.walk(out):
            for name in sorted(names):
                if name.endswith(".py"):
                    relative = os.path.relpath(os.path.join(root, name), out)
                    module = relative[:-3].replace(os.sep, ".")
                    with open(os.path.join(out, relative)) as f:
                        text = rewrite(f.read(), module)
                    files[f"{NAME}/_proto/{relative.replace(os.sep, '/')}"] = text.encode()
    return files


def package_sources():
    """{path in the wheel: bytes} of attention_client/'s sources and py.typed."""
    files = {}
    root = os.path.join(HERE, NAME)
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "_proto"))
        for name in sorted(names):
            if name.endswith(".py") or name == "py.typed":
                if name == "_version.py":
                    continue  # Written below.
                path = os.path.join(folder, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, HERE).replace(os.sep, "/")] = f.read()
    return files


def _dist_info(version):
    """{file name: bytes} of the .dist-info folder, RECORD aside."""
    with open(os.path.join(HERE, "README.md"), "rb") as f:
        readme = f.read()
    return {"METADATA": METADATA.format(version=version).encode() + readme,
            "WHEEL": b"Wheel-Version: 1.0\nGenerator: attention-client _build_backend\n"
                     b"Root-Is-Purelib: true\nTag: py3-none-any\n",
            "entry_points.txt": ENTRY_POINTS.encode()}


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


# PEP 517 hooks.

def get_requires_for_build_wheel(config_settings=None):
    """Nothing, unless the stubs must be generated with grpc_tools (no protoc on PATH)."""
    return [] if _native_compiler() or _has_grpc_tools() else ["grpcio-tools"]


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist_info = f"{NAME}-{project_version()}.dist-info"
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    for name, data in _dist_info(project_version()).items():
        with open(os.path.join(metadata_directory, dist_info, name), "wb") as f:
            f.write(data)
    return dist_info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = project_version()
    files = package_sources()
    files.update(generated_stubs())
    files[f"{NAME}/_version.py"] = f'__version__ = "{version}"\n'.encode()
    return _write_wheel(wheel_directory, version, files)


def get_requires_for_build_editable(config_settings=None):
    return get_requires_for_build_wheel(config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """`pip install -e`: a wheel whose .pth puts client/python on sys.path; the stubs are
    generated into the source tree's attention_client/_proto (ignored by git), again on each
    `pip install -e` (after a proto/ change)."""
    for path, data in generated_stubs().items():
        target = os.path.join(HERE, *path.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)
    return _write_wheel(wheel_directory, project_version(),
                        {f"__editable__.{NAME}.pth": (HERE + "\n").encode()})


def _write_wheel(wheel_directory, version, files):
    """Writes the wheel of `files` ({path: bytes}) and its .dist-info; returns its name."""
    files = dict(files)
    dist_info = f"{NAME}-{version}.dist-info"
    files.update({f"{dist_info}/{name}": data for name, data in _dist_info(version).items()})
    record = [_record_line(path, data) for path, data in files.items()]
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel_name = f"{NAME}-{version}-py3-none-any.whl"
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w",
                         zipfile.ZIP_DEFLATED) as wheel:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return wheel_name
