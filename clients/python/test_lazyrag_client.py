#!/usr/bin/env python3
"""Integration test of the Python client through lazyrag-router (ctest label integration).

Starts a worker (lazyrag-worker with synthetic:tiny and an embedded store, or the fake worker
of the router's tests when lazyrag-worker is not built) and a router on loopback ports, runs
the client, example.py and a generic reflection client against the router, and stops all.

    LAZYRAG_ROUTER_BINARY=... LAZYRAG_WORKER_BINARY=... | LAZYRAG_FAKE_WORKER_BINARY=... \
        python3 clients/python/test_lazyrag_client.py

Exits 77 (skipped) when grpcio or grpcio-reflection is not installed. The client comes from
this folder (the lazyrag_client package with its shipped messages).
"""

import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase)
    from google.protobuf import descriptor_pool, message_factory
except ImportError as e:
    print(f"SKIP: {e} (pip install -r clients/python/requirements.txt)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROUTER = os.environ.get("LAZYRAG_ROUTER_BINARY", "")
WORKER = os.environ.get("LAZYRAG_WORKER_BINARY", "")
FAKE_WORKER = os.environ.get("LAZYRAG_FAKE_WORKER_BINARY", "")


class Process:
    """A child process whose stdout "... ready grpc=HOST:PORT ..." line is awaited."""

    def __init__(self, argv):
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout=60.0) -> str:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        buf = b""
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            for line in buf.decode(errors="replace").splitlines():
                if " ready " in line:
                    for field in line.split():
                        if field.startswith("grpc="):
                            return field[len("grpc="):]
        raise RuntimeError(f"{self.argv[0]} did not become ready: {buf!r}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ClientThroughRouterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lazyrag_pyclient_")
        cls.processes = []
        try:
            sys.path.insert(0, HERE)
            import lazyrag_client
            cls.lazyrag_client = lazyrag_client

            if WORKER:
                worker = Process([WORKER, "--listen=127.0.0.1:0", "--model=synthetic:tiny",
                                  f"--kvstore=embedded:{cls.tmp}/kv", "--metrics_port=-1"])
                cls.real_worker = True
            else:
                worker = Process([FAKE_WORKER])
                cls.real_worker = False
            cls.processes.append(worker)
            worker_address = worker.wait_ready()
            router = Process([ROUTER, "--listen=127.0.0.1:0", f"--workers={worker_address}",
                              "--metrics_port=-1", "--poll_interval_s=0.2"])
            cls.processes.append(router)
            cls.target = router.wait_ready()
            cls.client = lazyrag_client.Client(cls.target, timeout=60)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "client", None) is not None:
            cls.client.close()
        for p in reversed(cls.processes):
            p.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_generate_streams_and_reuses_documents(self):
        docs = ["The mill grinds grain by the river.", "The river flows past the old hill."]
        chunks = list(self.client.generate("What does the mill do?", docs, max_tokens=6,
                                           ignore_eos=True))
        self.assertGreaterEqual(len(chunks), 1)
        last = chunks[-1]
        self.assertNotEqual(last.finish_reason, 0)
        self.assertEqual(len(last.document_ids), 2)
        self.assertEqual(sum(len(c.token_ids) for c in chunks), 6)

        # The same documents in the other order: their KV is reused.
        again = self.client.generate_text("And the river?", list(reversed(docs)), max_tokens=6,
                                          ignore_eos=True)
        self.assertEqual(again.finish_reason, "length")
        self.assertEqual(len(again.token_ids), 6)
        self.assertEqual(again.document_ids, list(reversed(last.document_ids)))
        self.assertEqual(again.usage.cached_document_tokens, again.usage.document_tokens)
        self.assertGreater(again.usage.document_tokens, 0)
        u = again.usage
        self.assertEqual(u.cached_document_tokens,
                         u.pool_document_tokens + u.host_document_tokens + u.store_document_tokens)

    def test_prepare_then_generate_by_id(self):
        prepared = self.client.prepare_documents(["A prepared document about bridges."])
        self.assertEqual(len(prepared), 1)
        self.assertEqual(len(prepared[0].id), 64)
        answer = self.client.generate_text("Bridges?", [{"id": prepared[0].id}], max_tokens=3,
                                           ignore_eos=True)
        self.assertEqual(answer.document_ids, [prepared[0].id])
        self.assertEqual(answer.usage.cached_document_tokens, answer.usage.document_tokens)
        stats = self.client.stats()
        self.assertIn(prepared[0].id, list(stats.resident_document_ids))
        # The router sums its workers' host tiers; this stack's CPU worker has none (-1 on cpu).
        self.assertLessEqual(stats.host_cache.used_bytes, stats.host_cache.capacity_bytes)

    def test_async_client(self):
        import asyncio

        async def run():
            async with self.lazyrag_client.AsyncClient(self.target, timeout=60) as c:
                docs = ["The mill grinds grain by the river.", "An async document."]
                chunks = [m async for m in c.generate("Async?", docs, max_tokens=4,
                                                      ignore_eos=True)]
                answer = await c.generate_text("Async?", docs, max_tokens=4, ignore_eos=True)
                stats = await c.stats()
                with self.assertRaises(grpc.RpcError) as raised:
                    await c.generate_text("", docs, max_tokens=2)
                return chunks, answer, stats, raised.exception.code()

        chunks, answer, stats, code = asyncio.run(run())
        self.assertEqual(sum(len(m.token_ids) for m in chunks), 4)
        self.assertEqual(answer.finish_reason, "length")
        self.assertEqual(len(answer.document_ids), 2)
        self.assertEqual(answer.usage.cached_document_tokens, answer.usage.document_tokens)
        self.assertGreaterEqual(len(stats.resident_document_ids), 2)
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)

    def test_errors_are_rpc_errors_with_the_server_code(self):
        with self.assertRaises(grpc.RpcError) as raised:
            self.client.generate_text("", ["a document"], max_tokens=3)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(grpc.RpcError) as raised:
            self.client.generate_text("q", [{"id": "f" * 64}], max_tokens=3)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(ValueError):
            self.client.request("q", mode="fastest")

    def test_example_runs(self):
        env = dict(os.environ)
        out = subprocess.run([sys.executable, os.path.join(HERE, "example.py"), "--target",
                              self.target, "--max_tokens", "4"], env=env, capture_output=True,
                             text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.count("A: "), 3, out.stdout)
        self.assertIn("cached document tokens", out.stdout)

    def test_reflection_serves_a_generic_client(self):
        # No generated code here: everything comes from the server's reflection service.
        with grpc.insecure_channel(self.target) as channel:
            database = ProtoReflectionDescriptorDatabase(channel)
            services = database.get_services()
            self.assertIn("lazyrag.v1.Inference", services)
            self.assertIn("grpc.health.v1.Health", services)
            pool = descriptor_pool.DescriptorPool(database)
            service = pool.FindServiceByName("lazyrag.v1.Inference")
            method = service.methods_by_name["Generate"]
            self.assertTrue(method.server_streaming)
            request_class = message_factory.GetMessageClass(method.input_type)
            response_class = message_factory.GetMessageClass(method.output_type)
            request = request_class(query="Reflected?", max_tokens=2, ignore_eos=True)
            request.documents.add(text="A document sent by a generic client.")
            call = channel.unary_stream("/lazyrag.v1.Inference/Generate",
                                        request_serializer=request_class.SerializeToString,
                                        response_deserializer=response_class.FromString)
            messages = list(call(request, timeout=60))
            self.assertEqual(sum(len(m.token_ids) for m in messages), 2)
            self.assertEqual(len(messages[-1].document_ids), 1)



TLS_DIR = os.path.join(HERE, "..", "..", "tests", "fixtures", "tls")


class ClientOverTlsTest(unittest.TestCase):
    """A worker serving gRPC over TLS (--tls_cert/--tls_key/--tls_ca) and the client's TLS
    options: by default the worker requires a client certificate (mTLS), so the client answers
    with its certificate and is refused with the CA alone; with --tls_require_client_cert=false
    the CA alone answers too; none without TLS."""

    def test_tls_worker(self):
        if not WORKER:
            self.skipTest("needs lazyrag-worker")
        sys.path.insert(0, HERE)
        import lazyrag_client
        ca, cert, key = (os.path.join(TLS_DIR, f) for f in ("ca.pem", "cert.pem", "key.pem"))
        with_cert = {"tls_ca": ca, "tls_cert": cert, "tls_key": key}

        def answers(target, kwargs):
            with lazyrag_client.Client(target, timeout=30, **kwargs) as c:
                a = c.generate_text("Which river?", ["The Vantor river freezes."],
                                    max_tokens=3, ignore_eos=True)
                self.assertEqual(a.usage.completion_tokens, 3)

        for require in (True, False):
            worker = Process([WORKER, "--listen=127.0.0.1:0", "--model=synthetic:tiny",
                              "--metrics_port=-1", f"--tls_cert={cert}", f"--tls_key={key}",
                              f"--tls_ca={ca}",
                              f"--tls_require_client_cert={'true' if require else 'false'}"])
            try:
                target = worker.wait_ready()
                answers(target, with_cert)
                if require:
                    with self.assertRaises(grpc.RpcError):
                        answers(target, {"tls_ca": ca})
                else:
                    answers(target, {"tls_ca": ca})
                with lazyrag_client.Client(target, timeout=10) as plain:
                    with self.assertRaises(grpc.RpcError):
                        plain.generate_text("Which river?", ["The Vantor river freezes."],
                                            max_tokens=3)
            finally:
                worker.stop()


if __name__ == "__main__":
    if not ROUTER or not (WORKER or FAKE_WORKER):
        print("set LAZYRAG_ROUTER_BINARY and LAZYRAG_WORKER_BINARY or LAZYRAG_FAKE_WORKER_BINARY")
        sys.exit(2)
    unittest.main(verbosity=2)
