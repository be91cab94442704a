"""The lazyrag gRPC client: Client (blocking) and AsyncClient (asyncio), for a router or a worker
(both serve the same Inference API, proto/lazyrag/v1/inference.proto)."""

from __future__ import annotations

import dataclasses
from typing import (AsyncIterator, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Union)

import grpc
import grpc.aio

from . import inference_pb2 as pb2

# The router's address in the README's quick start.
DEFAULT_TARGET = "127.0.0.1:7000"

MODES = ("lazy", "materialize", "prefix", "full")

# A document: its text, or {"id": ID} for a document the server has seen ({"text": T} works
# too).
DocumentLike = Union[str, Mapping[str, str]]

_GENERATE = "/lazyrag.v1.Inference/Generate"
_PREPARE = "/lazyrag.v1.Inference/PrepareDocuments"
_STATS = "/lazyrag.v1.Inference/Stats"


@dataclasses.dataclass
class Answer:
    """A whole Generate stream, joined."""
    text: str
    token_ids: List[int]
    finish_reason: str  # "length", "stop", "eos" or "cancelled"
    usage: pb2.Usage
    timings: pb2.Timings  # server side, milliseconds
    document_ids: List[str]


def build_request(query: str, documents: Sequence[DocumentLike] = (), *, system_prompt: str = "",
                  max_tokens: int = 64, temperature: float = 0.0, top_p: float = 0.0,
                  top_k: int = 0, seed: int = 0, stop: Iterable[str] = (),
                  ignore_eos: bool = False, mode: str = "lazy", cache_namespace: str = "",
                  request_id: str = "") -> pb2.GenerateRequest:
    """A GenerateRequest. documents: texts or {"id": ID} / {"text": T}, in prompt order.
    Raises ValueError for an unknown mode or a document that is neither."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    req = pb2.GenerateRequest(
        request_id=request_id, system_prompt=system_prompt, query=query, max_tokens=max_tokens,
        stop=list(stop), ignore_eos=ignore_eos,
        mode=pb2.AttentionMode.Value("ATTENTION_MODE_" + mode.upper()),
        cache_namespace=cache_namespace,
        sampling=pb2.SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                                    seed=seed))
    for i, d in enumerate(documents):
        if isinstance(d, str):
            req.documents.add(text=d)
        elif "id" in d:
            req.documents.add(id=d["id"])
        elif "text" in d:
            req.documents.add(text=d["text"])
        else:
            raise ValueError(f"documents[{i}] is neither a text nor {{'id': ...}}")
    return req


class _Join:
    """Joins a Generate stream into an Answer."""

    def __init__(self):
        self.text: List[str] = []
        self.tokens: List[int] = []
        self.last: Optional[pb2.GenerateResponse] = None

    def add(self, message: pb2.GenerateResponse) -> None:
        self.text.append(message.text)
        self.tokens.extend(message.token_ids)
        if message.finish_reason:
            self.last = message

    def answer(self) -> Answer:
        if self.last is None:
            raise RuntimeError("the stream ended without a final message")
        reason = pb2.FinishReason.Name(self.last.finish_reason)
        return Answer(text="".join(self.text), token_ids=self.tokens,
                      finish_reason=reason.replace("FINISH_REASON_", "").lower(),
                      usage=self.last.usage, timings=self.last.timings,
                      document_ids=list(self.last.document_ids))


def _auth_metadata(auth_token: Optional[str]):
    """The call metadata carrying a bearer token; None without one."""
    return (("authorization", "Bearer " + auth_token),) if auth_token else None


def _credentials(tls_ca: Optional[str], tls_cert: Optional[str],
                 tls_key: Optional[str]) -> Optional[grpc.ChannelCredentials]:
    if tls_ca is None:
        return None

    def read(path):
        with open(path, "rb") as f:
            return f.read()
    return grpc.ssl_channel_credentials(
        root_certificates=read(tls_ca), private_key=read(tls_key) if tls_key else None,
        certificate_chain=read(tls_cert) if tls_cert else None)


class Client:
    """A blocking connection to a lazyrag router or worker. Thread-safe (one gRPC channel).

    Errors are grpc.RpcError with the server's status code (INVALID_ARGUMENT, NOT_FOUND,
    RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED, ...).
    """

    def __init__(self, target: str = DEFAULT_TARGET, *, timeout: Optional[float] = 60.0,
                 channel: Optional[grpc.Channel] = None, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 auth_token: Optional[str] = None):
        """target: "HOST:PORT". timeout: default deadline of each call in seconds (None: none).

        TLS (servers started with --tls_cert/--tls_key/--tls_ca): tls_ca is the PEM CA file the
        server is verified against; tls_cert and tls_key (PEM files) present a client
        certificate (servers require one unless started with --tls_require_client_cert=false).
        Without tls_ca the channel is plaintext.

        auth_token: the bearer token for servers started with --auth_tokens_file, sent as
        "authorization: Bearer TOKEN" on every call (UNAUTHENTICATED without it)."""
        self._metadata = _auth_metadata(auth_token)
        if channel is None:
            creds = _credentials(tls_ca, tls_cert, tls_key)
            channel = (grpc.secure_channel(target, creds) if creds
                       else grpc.insecure_channel(target))
        self._channel = channel
        self._timeout = timeout
        self._generate = channel.unary_stream(
            _GENERATE, request_serializer=pb2.GenerateRequest.SerializeToString,
            response_deserializer=pb2.GenerateResponse.FromString)
        self._prepare = channel.unary_unary(
            _PREPARE, request_serializer=pb2.PrepareDocumentsRequest.SerializeToString,
            response_deserializer=pb2.PrepareDocumentsResponse.FromString)
        self._stats = channel.unary_unary(
            _STATS, request_serializer=pb2.StatsRequest.SerializeToString,
            response_deserializer=pb2.StatsResponse.FromString)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pb2(self):
        """The generated message module (lazyrag.v1 messages)."""
        return pb2

    def request(self, query: str, documents: Sequence[DocumentLike] = (),
                **options) -> pb2.GenerateRequest:
        """Builds a GenerateRequest (see build_request)."""
        return build_request(query, documents, **options)

    def generate(self, query: str, documents: Sequence[DocumentLike] = (), *,
                 timeout: Optional[float] = None, **options) -> Iterator[pb2.GenerateResponse]:
        """Streams GenerateResponse messages. documents: texts or {"id": ID}, in prompt order.
        options: system_prompt, max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos,
        mode ("lazy" | "materialize" | "prefix" | "full"), cache_namespace, request_id.
        Cancel by calling .cancel() on the returned iterator."""
        req = build_request(query, documents, **options)
        return self._generate(req, timeout=timeout or self._timeout, metadata=self._metadata)

    def generate_text(self, query: str, documents: Sequence[DocumentLike] = (), *,
                      timeout: Optional[float] = None, **options) -> Answer:
        """Runs generate() to the end and joins the stream."""
        join = _Join()
        for message in self.generate(query, documents, timeout=timeout, **options):
            join.add(message)
        return join.answer()

    def prepare_documents(self, texts: Sequence[str], *, cache_namespace: str = "",
                          timeout: Optional[float] = None) -> List[pb2.PreparedDocument]:
        """Computes documents ahead of requests; returns a PreparedDocument (id, num_tokens,
        computed) per text, in order."""
        req = pb2.PrepareDocumentsRequest(texts=list(texts), cache_namespace=cache_namespace)
        return list(self._prepare(req, timeout=timeout or self._timeout,
                                  metadata=self._metadata).documents)

    def stats(self, *, timeout: Optional[float] = None) -> pb2.StatsResponse:
        """Load and cache state (a router sums its workers')."""
        return self._stats(pb2.StatsRequest(), timeout=timeout or self._timeout,
                           metadata=self._metadata)


class AsyncClient:
    """The asyncio variant of Client (grpc.aio). Use it inside one event loop:

        async with AsyncClient("127.0.0.1:7000") as c:
            async for m in c.generate("Q?", ["doc"]):
                print(m.text, end="")
            answer = await c.generate_text("Q?", ["doc"])

    Errors are grpc.aio.AioRpcError (a grpc.RpcError) with the server's status code.
    """

    def __init__(self, target: str = DEFAULT_TARGET, *, timeout: Optional[float] = 60.0,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, auth_token: Optional[str] = None):
        """As Client (auth_token: the bearer token of a server with --auth_tokens_file)."""
        self._metadata = _auth_metadata(auth_token)
        creds = _credentials(tls_ca, tls_cert, tls_key)
        self._channel = (grpc.aio.secure_channel(target, creds) if creds
                         else grpc.aio.insecure_channel(target))
        self._timeout = timeout
        self._generate = self._channel.unary_stream(
            _GENERATE, request_serializer=pb2.GenerateRequest.SerializeToString,
            response_deserializer=pb2.GenerateResponse.FromString)
        self._prepare = self._channel.unary_unary(
            _PREPARE, request_serializer=pb2.PrepareDocumentsRequest.SerializeToString,
            response_deserializer=pb2.PrepareDocumentsResponse.FromString)
        self._stats = self._channel.unary_unary(
            _STATS, request_serializer=pb2.StatsRequest.SerializeToString,
            response_deserializer=pb2.StatsResponse.FromString)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def generate(self, query: str, documents: Sequence[DocumentLike] = (), *,
                       timeout: Optional[float] = None,
                       **options) -> AsyncIterator[pb2.GenerateResponse]:
        """Streams GenerateResponse messages (see Client.generate). Leaving the loop early
        cancels the call."""
        req = build_request(query, documents, **options)
        call = self._generate(req, timeout=timeout or self._timeout, metadata=self._metadata)
        try:
            async for message in call:
                yield message
        finally:
            call.cancel()  # no-op once the call has ended

    async def generate_text(self, query: str, documents: Sequence[DocumentLike] = (), *,
                            timeout: Optional[float] = None, **options) -> Answer:
        join = _Join()
        async for message in self.generate(query, documents, timeout=timeout, **options):
            join.add(message)
        return join.answer()

    async def prepare_documents(self, texts: Sequence[str], *, cache_namespace: str = "",
                                timeout: Optional[float] = None) -> List[pb2.PreparedDocument]:
        req = pb2.PrepareDocumentsRequest(texts=list(texts), cache_namespace=cache_namespace)
        return list((await self._prepare(req, timeout=timeout or self._timeout,
                                         metadata=self._metadata)).documents)

    async def stats(self, *, timeout: Optional[float] = None) -> pb2.StatsResponse:
        return await self._stats(pb2.StatsRequest(), timeout=timeout or self._timeout,
                                 metadata=self._metadata)
