"""A small Python client for lazyrag (a router or a worker: both serve the same API).

    from lazyrag_client import Client

    with Client("127.0.0.1:50051") as client:
        for chunk in client.generate("Who wrote it?", documents=["doc text", {"id": doc_id}]):
            print(chunk.text, end="", flush=True)
        answer = client.generate_text("Who wrote it?", documents=["doc text"])
        print(answer.text, answer.timings.ttft_ms, answer.usage.cached_document_tokens)

The gRPC stubs are generated from proto/ by generate.sh (never committed). Pass their folder
as stubs_dir, or set LAZYRAG_PY_STUBS, or put it on PYTHONPATH.
"""

import dataclasses
import importlib
import os
import sys
from typing import Iterable, Iterator, List, Mapping, Optional, Sequence, Union

import grpc

_MODES = ("lazy", "materialize", "prefix", "full")

# A document: its text, or {"id": ID} for a document the server has seen ({"text": T} works too).
DocumentLike = Union[str, Mapping[str, str]]


def load_stubs(stubs_dir: Optional[str] = None):
    """Imports and returns (inference_pb2, inference_pb2_grpc) from stubs_dir, $LAZYRAG_PY_STUBS
    or sys.path."""
    folder = stubs_dir or os.environ.get("LAZYRAG_PY_STUBS")
    if folder and folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        pb2 = importlib.import_module("lazyrag.v1.inference_pb2")
        pb2_grpc = importlib.import_module("lazyrag.v1.inference_pb2_grpc")
    except ImportError as e:
        raise ImportError(
            "lazyrag stubs not found: run clients/python/generate.sh DIR and pass stubs_dir=DIR "
            "(or set LAZYRAG_PY_STUBS=DIR)") from e
    return pb2, pb2_grpc


@dataclasses.dataclass
class Answer:
    """A whole Generate stream, joined."""
    text: str
    token_ids: List[int]
    finish_reason: str  # "length", "stop", "eos" or "cancelled"
    usage: object       # lazyrag.v1.Usage
    timings: object     # lazyrag.v1.Timings (server side, milliseconds)
    document_ids: List[str]


class Client:
    """A connection to a lazyrag router or worker. Thread-safe (one gRPC channel).

    Errors are grpc.RpcError with the server's status code (INVALID_ARGUMENT, NOT_FOUND,
    RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED, ...).
    """

    def __init__(self, target: str, *, timeout: Optional[float] = 60.0,
                 stubs_dir: Optional[str] = None, channel: Optional[grpc.Channel] = None,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None):
        """target: "HOST:PORT". timeout: default deadline of each call in seconds (None: none).

        TLS (servers started with --tls_cert/--tls_key/--tls_ca): tls_ca is the PEM CA file the
        server is verified against; tls_cert and tls_key (PEM files) present a client
        certificate, optional. Without tls_ca the channel is plaintext."""
        self._pb2, pb2_grpc = load_stubs(stubs_dir)
        if channel is None and tls_ca is not None:
            def read(path):
                with open(path, "rb") as f:
                    return f.read()
            creds = grpc.ssl_channel_credentials(
                root_certificates=read(tls_ca),
                private_key=read(tls_key) if tls_key else None,
                certificate_chain=read(tls_cert) if tls_cert else None)
            channel = grpc.secure_channel(target, creds)
        self._channel = channel or grpc.insecure_channel(target)
        self._stub = pb2_grpc.InferenceStub(self._channel)
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pb2(self):
        """The generated message module (lazyrag.v1.inference_pb2)."""
        return self._pb2

    def request(self, query: str, documents: Sequence[DocumentLike] = (), *,
                system_prompt: str = "", max_tokens: int = 64, temperature: float = 0.0,
                top_p: float = 0.0, top_k: int = 0, seed: int = 0, stop: Iterable[str] = (),
                ignore_eos: bool = False, mode: str = "lazy", cache_namespace: str = "",
                request_id: str = ""):
        """Builds a GenerateRequest (see generate)."""
        pb2 = self._pb2
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, not {mode!r}")
        req = pb2.GenerateRequest(
            request_id=request_id, system_prompt=system_prompt, query=query,
            max_tokens=max_tokens, stop=list(stop), ignore_eos=ignore_eos,
            mode=pb2.AttentionMode.Value("ATTENTION_MODE_" + mode.upper()),
            cache_namespace=cache_namespace,
            sampling=pb2.SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                                        seed=seed))
        for d in documents:
            if isinstance(d, str):
                req.documents.add(text=d)
            elif "id" in d:
                req.documents.add(id=d["id"])
            else:
                req.documents.add(text=d["text"])
        return req

    def generate(self, query: str, documents: Sequence[DocumentLike] = (), *,
                 timeout: Optional[float] = None, **options) -> Iterator:
        """Streams GenerateResponse messages. documents: texts or {"id": ID}, in prompt order.
        options: system_prompt, max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos,
        mode ("lazy" | "materialize" | "prefix" | "full"), cache_namespace, request_id.
        Cancel by closing the iterator (or .cancel() on it)."""
        req = self.request(query, documents, **options)
        return self._stub.Generate(req, timeout=timeout or self._timeout)

    def generate_text(self, query: str, documents: Sequence[DocumentLike] = (), *,
                      timeout: Optional[float] = None, **options) -> Answer:
        """Runs generate() to the end and joins the stream."""
        text, tokens, last = [], [], None
        for message in self.generate(query, documents, timeout=timeout, **options):
            text.append(message.text)
            tokens.extend(message.token_ids)
            if message.finish_reason:
                last = message
        if last is None:
            raise RuntimeError("the stream ended without a final message")
        reason = self._pb2.FinishReason.Name(last.finish_reason)
        return Answer(text="".join(text), token_ids=tokens,
                      finish_reason=reason.replace("FINISH_REASON_", "").lower(),
                      usage=last.usage, timings=last.timings,
                      document_ids=list(last.document_ids))

    def prepare_documents(self, texts: Sequence[str], *, cache_namespace: str = "",
                          timeout: Optional[float] = None) -> list:
        """Computes documents ahead of requests; returns a PreparedDocument (id, num_tokens,
        computed) per text, in order."""
        req = self._pb2.PrepareDocumentsRequest(texts=list(texts), cache_namespace=cache_namespace)
        return list(self._stub.PrepareDocuments(req, timeout=timeout or self._timeout).documents)

    def stats(self, *, timeout: Optional[float] = None):
        """Load and cache state (a router sums its workers')."""
        return self._stub.Stats(self._pb2.StatsRequest(), timeout=timeout or self._timeout)
