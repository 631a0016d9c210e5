"""The Python package installs with any Python >= 3.9 that has grpcio, and the install commands
name the interpreter they need (issue 38, wall 6).

* `pip install ./client/python` into a fresh virtual environment WITHOUT Debian's packages
  (pip and setuptools only, no `wheel`: as a Python that is not Debian's, first on PATH, often
  is), offline and with pip's default build isolation, builds and installs the package: its
  build backend needs nothing but the standard library (setuptools before 70.1 failed there:
  "invalid command 'bdist_wheel'"). With grpcio, protobuf and numpy importable (Debian's,
  through PYTHONPATH here), the installed package imports, with its stubs and version, and its
  attention-export command is installed.
* Every `-m venv` command in README.md, docs/ and the package names /usr/bin/python3 (the
  interpreter whose packages a --system-site-packages venv sees), never a bare `python3`.

Run by CTest as python_install_test (ATTENTION_REPO set there); needs no server.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile
import unittest

REPO = os.environ.get("ATTENTION_REPO",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))


def debian_site_of(module):
    """The folder /usr/bin/python3 imports `module` from (Debian's dist-packages)."""
    result = subprocess.run(["/usr/bin/python3", "-c", f"import os, {module}; print(os.path."
                             f"dirname(os.path.dirname({module}.__file__)))"],
                            capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


class InstallTest(unittest.TestCase):
    def test_installs_without_debians_packages_or_wheel(self):
        with tempfile.TemporaryDirectory(prefix="attention-install-") as tmp:
            venv = os.path.join(tmp, "venv")
            subprocess.run(["/usr/bin/python3", "-m", "venv", venv], check=True)
            python = os.path.join(venv, "bin", "python")
            plain = {k: v for k, v in os.environ.items()
                     if k not in ("PYTHONPATH", "ATTENTION_PY_GEN", "VIRTUAL_ENV")}
            has_wheel = subprocess.run([python, "-c", "import wheel"], env=plain,
                                       capture_output=True).returncode == 0
            self.assertFalse(has_wheel, "the fresh venv has `wheel`: not the case under test")
            # Offline (no index), default build isolation; --no-deps: grpcio, protobuf and
            # numpy come from Debian below (pip would fetch them online).
            result = subprocess.run(
                [python, "-m", "pip", "install", "--no-deps", "--no-index",
                 "--disable-pip-version-check", "./client/python"],
                cwd=REPO, env=plain, capture_output=True, text=True, timeout=300)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertTrue(os.path.isfile(os.path.join(venv, "bin", "attention-export")))
            site = debian_site_of("grpc")
            if site is None:
                self.skipTest("/usr/bin/python3 has no grpcio to import the package with")
            code = ("import attention_client, attention_client.stubs as s; "
                    "print(attention_client.__version__, attention_client.__file__, "
                    "s.attention_pb2.InferRequest.DESCRIPTOR.full_name)")
            result = subprocess.run([python, "-c", code], cwd=tmp,
                                    env=dict(plain, PYTHONPATH=site), capture_output=True,
                                    text=True, timeout=120)
            self.assertEqual(result.returncode, 0, result.stderr)
            version, path, message = result.stdout.split()
            self.assertRegex(version, r"^[0-9]+\.[0-9]+\.[0-9]+$")
            self.assertTrue(path.startswith(venv), path)
            self.assertEqual(message, "attention.v1.InferRequest")

    def test_install_commands_name_the_interpreter(self):
        files = [os.path.join(REPO, "README.md"), os.path.join(REPO, "client", "python",
                                                               "pyproject.toml")]
        files += glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
        files += glob.glob(os.path.join(REPO, "client", "python", "**", "*.py"), recursive=True)
        bare = []
        for path in files:
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    for match in re.finditer(r"([\w./~-]*)python3? -m venv", line):
                        if match.group(1) != "/usr/bin/" and "tests" not in path.split(os.sep):
                            bare.append(f"{os.path.relpath(path, REPO)}:{number}: "
                                        f"{line.strip()}")
        self.assertEqual(bare, [], "install commands that do not name /usr/bin/python3")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
