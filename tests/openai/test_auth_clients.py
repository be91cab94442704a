#!/usr/bin/env python3
"""The clients' token options against a live stack with authentication (issue 28): router and
worker with --auth_tokens_file, the router calling the worker with its own worker token.
  * the openai SDK: api_key=TOKEN answers; a wrong key is openai.AuthenticationError (401);
  * lazyrag_client.Client (clients/python, from the source tree): auth_token=TOKEN answers and
    lists its own documents in stats(); without a token: UNAUTHENTICATED.

    LAZYRAG_ROUTER_BINARY=... LAZYRAG_WORKER_BINARY=... python3 tests/openai/test_auth_clients.py

Exits 77 (skipped) when the openai or grpc package is missing.
"""

import os
import sys
import tempfile
import unittest

try:
    import grpc
    import openai
except ImportError as e:
    print(f"SKIP: {e} (deploy/local/bootstrap.sh installs openai and grpcio)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
from live_stack import LiveStack  # noqa: E402
from lazyrag_client import Client  # noqa: E402

ROUTER = os.environ["LAZYRAG_ROUTER_BINARY"]
WORKER = os.environ["LAZYRAG_WORKER_BINARY"]
ACME = "acme-client-token-000001"
WORKER_TOKEN = "cluster-worker-token-001"
DOC = "The Vantor river freezes every January and thaws in early April."


class AuthClientsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory(prefix="lazyrag_auth_")
        tokens = os.path.join(cls.dir.name, "tokens")
        own = os.path.join(cls.dir.name, "worker-token")
        with open(tokens, "w") as f:
            f.write(f"{ACME} acme client\n{WORKER_TOKEN} cluster worker\n")
        with open(own, "w") as f:
            f.write(WORKER_TOKEN + "\n")
        auth = [f"--auth_tokens_file={tokens}", f"--auth_token_file={own}"]
        cls.stack = LiveStack(ROUTER, WORKER, worker_args=auth, router_args=auth)
        cls.stack.model = "synthetic:tiny"  # answers are noise; authentication is what is tested
        cls.stack.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.stack.__exit__(None, None, None)
        cls.dir.cleanup()

    def chat(self, api_key):
        client = openai.OpenAI(base_url=self.stack.http_base + "/v1", api_key=api_key,
                               max_retries=0, timeout=120)
        return client.chat.completions.create(
            model="m", max_tokens=4, messages=[{"role": "user", "content": "Which river?"}],
            extra_body={"documents": [{"text": DOC}]})

    def test_openai_sdk_api_key_is_the_bearer_token(self):
        r = self.chat(ACME)
        self.assertEqual(r.usage.completion_tokens, 4)
        with self.assertRaises(openai.AuthenticationError):
            self.chat("not-a-known-token-at-all")

    def test_python_client_auth_token(self):
        with Client(self.stack.grpc_target, auth_token=ACME) as c:
            a = c.generate_text("Which river?", [DOC], max_tokens=4, ignore_eos=True)
            self.assertEqual(a.usage.completion_tokens, 4)
            self.assertIn(a.document_ids[0], list(c.stats().resident_document_ids))
        with Client(self.stack.grpc_target) as c:
            with self.assertRaises(grpc.RpcError) as e:
                c.stats()
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)


if __name__ == "__main__":
    unittest.main(verbosity=2)
