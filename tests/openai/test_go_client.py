#!/usr/bin/env python3
"""The Go example client (clients/go), built from the proto alone with Debian's Go packages
(clients/go/build.sh), run against a live router + CPU worker: four streamed answers, the
reordered requests reuse every document, the by-id request too; and a clean exit 1 with the
gRPC status when the router is not there.

    LAZYRAG_ROUTER_BINARY=... LAZYRAG_WORKER_BINARY=... python3 tests/openai/test_go_client.py

Exits 77 (skipped, saying what is missing) without go, protoc-gen-go or gRPC-Go.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from live_stack import LiveStack  # noqa: E402


class GoClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.binary = os.path.join(cls.build_dir, "bin", "lazyrag-go-example")
        cls.stack = LiveStack(os.environ["LAZYRAG_ROUTER_BINARY"],
                              os.environ["LAZYRAG_WORKER_BINARY"])
        cls.stack.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.stack.__exit__(None, None, None)

    def test_example_against_the_router(self):
        out = subprocess.run([self.binary, "-target", self.stack.grpc_target, "-max_tokens", "8"],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertEqual(out.stdout.count("A: "), 4, out.stdout)
        cached = re.findall(r"cached document tokens (\d+)/(\d+)", out.stdout)
        self.assertEqual(len(cached), 4, out.stdout)
        self.assertEqual(cached[0][0], "0", out.stdout)
        for got, total in cached[1:]:
            self.assertEqual(got, total, out.stdout)
            self.assertGreater(int(total), 0, out.stdout)
        self.assertIn("resident documents", out.stdout)

    def test_error_exit(self):
        out = subprocess.run([self.binary, "-target", "127.0.0.1:1", "-timeout", "1s"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("lazyrag-go-example: connecting to 127.0.0.1:1", out.stderr)


if __name__ == "__main__":
    tmp_build = tempfile.mkdtemp(prefix="lazyrag_go_build_")
    build = subprocess.run([os.path.join(REPO, "clients", "go", "build.sh"), tmp_build],
                           capture_output=True, text=True)
    if build.returncode == 77:
        print(f"SKIP: {build.stdout.strip()}")
        sys.exit(77)
    if build.returncode != 0:
        print(build.stdout + build.stderr)
        sys.exit(1)
    GoClientTest.build_dir = tmp_build
    try:
        result = unittest.main(verbosity=2, exit=False).result
    finally:
        shutil.rmtree(tmp_build, ignore_errors=True)
    sys.exit(0 if result.wasSuccessful() else 1)
