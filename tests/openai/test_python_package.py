#!/usr/bin/env python3
"""`pip install ./clients/python` into a fresh virtual environment, then the installed package
(not the source folder) against a live router + CPU worker: clients/python/example.py run from
another folder, the async client, and the shipped type stubs.

    LAZYRAG_ROUTER_BINARY=... LAZYRAG_WORKER_BINARY=... python3 tests/openai/test_python_package.py

The venv sees the system's site packages (grpcio, protobuf, setuptools from bootstrap.sh), and
pip runs with --no-index: nothing is downloaded. Exits 77 (skipped) when venv, setuptools or
grpcio is missing.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import venv  # noqa: F401
    import setuptools  # noqa: F401
    import grpc  # noqa: F401
    import google.protobuf  # noqa: F401
except ImportError as e:
    print(f"SKIP: {e} (deploy/local/bootstrap.sh installs python3-venv and the client's packages)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from live_stack import LiveStack  # noqa: E402

ASYNC_SNIPPET = """
import asyncio, sys
from lazyrag_client import AsyncClient

async def main(target):
    async with AsyncClient(target) as c:
        a = await c.generate_text("Where does the Rhine rise?",
                                  ["The Rhine rises in the Swiss Alps."], max_tokens=4,
                                  ignore_eos=True)
        print("async", a.finish_reason, a.usage.completion_tokens, len(a.document_ids))

asyncio.run(main(sys.argv[1]))
"""


class InstalledPackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lazyrag_pkg_")
        venv_dir = os.path.join(cls.tmp, "venv")
        # Without a pip of its own (ensurepip would also bring an old setuptools that shadows the
        # system's): this interpreter's pip installs into it (pip --python).
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                        venv_dir], check=True)
        cls.python = os.path.join(venv_dir, "bin", "python")
        # Built from a copy, so that the build leaves nothing in the source tree.
        src = os.path.join(cls.tmp, "src")
        shutil.copytree(os.path.join(REPO, "clients", "python"), src,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        subprocess.run([sys.executable, "-m", "pip", "--python", cls.python, "install", "-q",
                        "--no-index", "--no-build-isolation", "--disable-pip-version-check", src],
                       check=True)
        cls.stack = LiveStack(os.environ["LAZYRAG_ROUTER_BINARY"],
                              os.environ["LAZYRAG_WORKER_BINARY"])
        cls.stack.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.stack.__exit__(None, None, None)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_in_tmp(self, argv):
        # Not from clients/python: the import must find the installed package.
        out = subprocess.run(argv, cwd=self.tmp, capture_output=True, text=True, timeout=300,
                             env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return out.stdout

    def test_installed_where_expected_with_type_stubs(self):
        out = self.run_in_tmp([self.python, "-c",
                               "import lazyrag_client, os; d = os.path.dirname("
                               "lazyrag_client.__file__); print(d); print(sorted(os.listdir(d)))"])
        folder = out.splitlines()[0]
        self.assertIn(os.path.join(self.tmp, "venv"), folder)
        for f in ("py.typed", "inference_pb2.pyi", "inference_pb2.py", "_client.py"):
            self.assertIn(f, out)

    def test_example_runs_from_the_installed_package(self):
        example = os.path.join(self.tmp, "example.py")
        shutil.copy(os.path.join(REPO, "clients", "python", "example.py"), example)
        out = self.run_in_tmp([self.python, example, "--target", self.stack.grpc_target,
                               "--max_tokens", "8"])
        self.assertEqual(out.count("A: "), 3, out)
        # The second and third requests reuse the three documents.
        lines = [line for line in out.splitlines() if "cached document tokens" in line]
        self.assertEqual(len(lines), 3, out)
        cached = [line.split("cached document tokens ")[1].split(" ")[0] for line in lines]
        self.assertTrue(cached[0].startswith("0/"), out)
        got, total = cached[2].split("/")
        self.assertEqual(got, total, out)
        self.assertGreater(int(total), 0, out)

    def test_async_client_from_the_installed_package(self):
        out = self.run_in_tmp([self.python, "-c", ASYNC_SNIPPET, self.stack.grpc_target])
        self.assertIn("async length 4 1", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
