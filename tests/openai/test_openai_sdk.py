#!/usr/bin/env python3
"""The official `openai` Python SDK against a live lazyrag router (OpenAI-compatible HTTP API,
issue 26) in front of a CPU worker on loopback: streaming and not, documents by text and by
id, cached_tokens > 0 on a reordered second request, /v1/completions, /v1/models, /health,
a client that goes away mid-stream, and every error status the stack can be driven to
(400, 404, 429, 503, 504).

    LAZYRAG_ROUTER_BINARY=... LAZYRAG_WORKER_BINARY=... python3 tests/openai/test_openai_sdk.py

Exits 77 (skipped) when the openai package is not installed (deploy/local/bootstrap.sh
installs it).
"""

import json
import os
import sys
import time
import unittest
import urllib.error
import urllib.request

try:
    import openai
except ImportError as e:
    print(f"SKIP: {e} (deploy/local/bootstrap.sh installs the openai package)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_stack import LiveStack, Process, model_path  # noqa: E402

ROUTER = os.environ["LAZYRAG_ROUTER_BINARY"]
WORKER = os.environ["LAZYRAG_WORKER_BINARY"]

DOCS = [
    {"title": "Ostrova", "text": "Mira Ostrova invented the folding telescope in 1788."},
    {"text": "The Vantor river freezes every January and thaws in early April."},
    {"text": "The Glass Archive of Pellorin was founded by the weaver Tamsin Reale."},
]
SYSTEM = "Answer the question in one sentence using only the documents."


class OpenAiSdkTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # A KV pool of 24 MiB holds these requests; a 3,000-token document does not fit (429).
        cls.stack = LiveStack(ROUTER, WORKER, worker_args=["--kv_pool_bytes=25165824"])
        cls.stack.__enter__()
        cls.client = openai.OpenAI(base_url=cls.stack.http_base + "/v1", api_key="unused",
                                   max_retries=0, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.stack.__exit__(None, None, None)

    def chat(self, question, documents, **kwargs):
        extra = kwargs.pop("extra_body", {})
        return self.client.chat.completions.create(
            model="smollm2", max_tokens=kwargs.pop("max_tokens", 12),
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            extra_body={"documents": documents, **extra}, **kwargs)

    def test_non_streaming_then_reordered_reuses_documents(self):
        first = self.chat("Who invented the folding telescope?", DOCS,
                          extra_body={"lazyrag": {"cache_namespace": "reorder"}})
        self.assertEqual(first.object, "chat.completion")
        self.assertEqual(first.model, "smollm2")
        self.assertEqual(first.choices[0].message.role, "assistant")
        self.assertTrue(first.choices[0].message.content)
        self.assertIn(first.choices[0].finish_reason, ("stop", "length"))
        self.assertGreater(first.usage.prompt_tokens, 0)
        self.assertGreater(first.usage.completion_tokens, 0)
        self.assertEqual(first.usage.total_tokens,
                         first.usage.prompt_tokens + first.usage.completion_tokens)
        ext = first.model_extra["lazyrag"]
        self.assertEqual(len(ext["document_ids"]), 3)
        self.assertEqual(first.usage.prompt_tokens_details.cached_tokens, 0)

        reordered = [DOCS[2], DOCS[0], DOCS[1]]
        second = self.chat("Who founded the Glass Archive?", reordered,
                           extra_body={"lazyrag": {"cache_namespace": "reorder"}})
        cached = second.usage.prompt_tokens_details.cached_tokens
        ext2 = second.model_extra["lazyrag"]
        self.assertGreater(cached, 0)
        self.assertEqual(cached, ext2["usage"]["document_tokens"])
        self.assertEqual(cached, ext2["usage"]["pool_document_tokens"] +
                         ext2["usage"]["host_document_tokens"] +
                         ext2["usage"]["store_document_tokens"])
        ids = ext["document_ids"]
        self.assertEqual(ext2["document_ids"], [ids[2], ids[0], ids[1]])

        # The same documents by id: nothing to compute for them.
        by_id = self.chat("When does the Vantor river freeze?", [{"id": i} for i in ids],
                          extra_body={"lazyrag": {"cache_namespace": "reorder"}})
        self.assertEqual(by_id.model_extra["lazyrag"]["document_ids"], ids)
        self.assertEqual(by_id.usage.prompt_tokens_details.cached_tokens,
                         by_id.model_extra["lazyrag"]["usage"]["document_tokens"])

    def test_streaming_with_usage(self):
        stream = self.chat("When does the Vantor river freeze?", DOCS[1:], stream=True,
                           stream_options={"include_usage": True}, max_tokens=10,
                           extra_body={"lazyrag": {"ignore_eos": True}})
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertTrue(text)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        self.assertEqual(finishes[-1], "length")
        self.assertTrue(all(f is None for f in finishes[:-1]))
        usage_chunk = chunks[-1]
        self.assertEqual(usage_chunk.choices, [])
        self.assertEqual(usage_chunk.usage.completion_tokens, 10)
        self.assertGreater(usage_chunk.usage.prompt_tokens, 0)
        self.assertIsNotNone(usage_chunk.usage.prompt_tokens_details)
        self.assertEqual(len(usage_chunk.model_extra["lazyrag"]["document_ids"]), 2)

        # Streaming and not give the same greedy answer.
        whole = self.chat("When does the Vantor river freeze?", DOCS[1:], max_tokens=10,
                          extra_body={"lazyrag": {"ignore_eos": True}})
        self.assertEqual(whole.choices[0].message.content, text)

    def test_completions_and_sampling_options(self):
        c = self.client.completions.create(model="smollm2", prompt="Who invented the telescope?",
                                           max_tokens=6, temperature=0.8, top_p=0.9, seed=7,
                                           extra_body={"documents": DOCS[:1]})
        self.assertEqual(c.object, "text_completion")
        self.assertTrue(c.choices[0].text)
        again = self.client.completions.create(model="smollm2",
                                               prompt="Who invented the telescope?", max_tokens=6,
                                               temperature=0.8, top_p=0.9, seed=7,
                                               extra_body={"documents": DOCS[:1]})
        self.assertEqual(again.choices[0].text, c.choices[0].text)  # equal seeds, equal outputs
        stopped = self.chat("Who invented the folding telescope?", DOCS[:1], max_tokens=40,
                            stop=[" "], extra_body={"lazyrag": {"ignore_eos": True}})
        self.assertEqual(stopped.choices[0].finish_reason, "stop")
        self.assertNotIn(" ", stopped.choices[0].message.content.strip())

    def test_models_and_health(self):
        models = self.client.models.list()
        self.assertEqual(len(models.data), 1)
        self.assertTrue(models.data[0].id)
        with urllib.request.urlopen(self.stack.http_base + "/health", timeout=10) as r:
            self.assertEqual(json.loads(r.read()), {"status": "ok"})

    def test_client_going_away_mid_stream_cancels_the_request(self):
        key = ('lazyrag_router_requests_total'
               f'{{outcome="cancelled",worker="{self.stack.worker_target}"}}')
        before = self.stack.metric(key)
        stream = self.chat("Tell me everything.", DOCS, stream=True, max_tokens=200,
                           extra_body={"lazyrag": {"ignore_eos": True}})
        for _ in stream:
            break
        stream.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = self.stack.metric(key)
            if now > before:
                break
            time.sleep(0.1)
        self.assertGreater(now, before, "the router never saw the cancellation")
        # The stack still answers.
        self.assertTrue(self.chat("Who invented the folding telescope?", DOCS[:1]).choices)

    def test_error_400(self):
        cases = [
            dict(messages=[{"role": "user", "content": ""}]),             # empty query (worker)
            dict(messages=[{"role": "user", "content": "q"}], max_tokens=10**9),  # over the cap
            dict(messages=[]),                                            # translation
            dict(messages=[{"role": "assistant", "content": "a"},
                           {"role": "user", "content": "q"}]),
            dict(messages=[{"role": "user", "content": "q"}], n=2),
        ]
        for kwargs in cases:
            with self.subTest(kwargs=kwargs):
                with self.assertRaises(openai.BadRequestError) as raised:
                    self.client.chat.completions.create(model="smollm2", **kwargs)
                err = raised.exception
                self.assertEqual(err.status_code, 400)
                self.assertEqual(err.body["type"], "invalid_request_error")
                self.assertTrue(err.body["message"])
        with self.assertRaises(openai.BadRequestError) as raised:
            self.client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "q"}],
                extra_body={"documents": [{"text": 5}]})
        self.assertEqual(raised.exception.body["param"], "documents[0].text")
        # Not JSON at all.
        req = urllib.request.Request(self.stack.http_base + "/v1/chat/completions", data=b"{oops",
                                     headers={"Content-Type": "application/json"})
        with self.assertRaises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(req, timeout=10)
        self.assertEqual(raised.exception.code, 400)
        self.assertEqual(json.loads(raised.exception.read())["error"]["code"], "invalid_argument")

    def test_error_404_unknown_document_id(self):
        for stream in (False, True):
            with self.assertRaises(openai.NotFoundError) as raised:
                r = self.chat("q", [{"id": "f" * 64}], stream=stream)
                if stream:
                    list(r)
            self.assertEqual(raised.exception.status_code, 404)
            self.assertEqual(raised.exception.body["code"], "not_found")

    def test_error_429_request_larger_than_the_pool(self):
        big = " ".join(f"word{i}" for i in range(1500))  # ~3,000 tokens, > the 24 MiB pool
        with self.assertRaises(openai.RateLimitError) as raised:
            self.chat("q", [{"text": big}])
        self.assertEqual(raised.exception.status_code, 429)
        self.assertEqual(raised.exception.body["code"], "resource_exhausted")

    def test_error_504_deadline(self):
        with self.assertRaises(openai.InternalServerError) as raised:
            self.chat("q", DOCS, max_tokens=200,
                      extra_body={"lazyrag": {"timeout_s": 0.001, "ignore_eos": True}})
        self.assertEqual(raised.exception.status_code, 504)
        self.assertEqual(raised.exception.body["code"], "deadline_exceeded")

    def test_error_503_no_worker(self):
        # A second router whose only worker address has nobody listening.
        tmp = self.stack.tmp
        router = Process([ROUTER, "--listen=127.0.0.1:0", "--workers=127.0.0.1:1",
                          "--http_listen=127.0.0.1:0", "--metrics_port=-1",
                          "--poll_interval_s=0.2"], os.path.join(tmp, "router503.log"))
        try:
            ready = router.wait_ready()
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{ready['http']}/v1",
                                   api_key="unused", max_retries=0, timeout=30)
            with self.assertRaises(openai.InternalServerError) as raised:
                client.chat.completions.create(model="m",
                                               messages=[{"role": "user", "content": "q"}])
            self.assertEqual(raised.exception.status_code, 503)
            self.assertEqual(raised.exception.body["code"], "unavailable")
            with self.assertRaises(urllib.error.HTTPError) as health:
                urllib.request.urlopen(f"http://127.0.0.1:{ready['http']}/health", timeout=10)
            self.assertEqual(health.exception.code, 503)
        finally:
            router.stop()


class WorkerHttpTest(unittest.TestCase):
    """A worker serves the same HTTP API itself (--http_listen on lazyrag-worker)."""

    def test_worker_http(self):
        import tempfile
        tmp = tempfile.mkdtemp(prefix="lazyrag_worker_http_")
        worker = Process([WORKER, "--listen=127.0.0.1:0", f"--model={model_path()}",
                          "--device=cpu", "--metrics_port=-1", "--http_listen=127.0.0.1:0",
                          "--shutdown_grace_s=1"], os.path.join(tmp, "worker.log"))
        try:
            ready = worker.wait_ready()
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{ready['http']}/v1",
                                   api_key="unused", max_retries=0, timeout=120)
            messages = [{"role": "user", "content": "Who invented the folding telescope?"}]
            first = client.chat.completions.create(model="m", max_tokens=6, messages=messages,
                                                   extra_body={"documents": DOCS})
            self.assertTrue(first.choices[0].message.content)
            again = client.chat.completions.create(model="m", max_tokens=6, messages=messages,
                                                   extra_body={"documents": DOCS[::-1]},
                                                   stream=True,
                                                   stream_options={"include_usage": True})
            chunks = list(again)
            self.assertGreater(chunks[-1].usage.prompt_tokens_details.cached_tokens, 0)
            self.assertTrue(client.models.list().data[0].id)
            with self.assertRaises(openai.BadRequestError):
                client.chat.completions.create(model="m", messages=messages, max_tokens=0)
            with self.assertRaises(openai.NotFoundError):
                client.chat.completions.create(model="m", messages=messages,
                                               extra_body={"documents": [{"id": "e" * 64}]})
        finally:
            worker.stop()
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
