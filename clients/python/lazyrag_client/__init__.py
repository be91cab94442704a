"""lazyrag's Python client (gRPC): `pip install ./clients/python`.

    from lazyrag_client import Client

    with Client("127.0.0.1:7000") as client:           # the router (or a worker)
        for chunk in client.generate("Who wrote it?", documents=["doc text", {"id": doc_id}]):
            print(chunk.text, end="", flush=True)
        answer = client.generate_text("Who wrote it?", documents=["doc text"])
        print(answer.text, answer.timings.ttft_ms, answer.usage.cached_document_tokens)

AsyncClient is the asyncio variant. The protobuf messages are lazyrag_client.pb2 (generated
from proto/ by generate.sh and shipped with the package).
"""

from . import inference_pb2 as pb2
from ._client import (DEFAULT_TARGET, MODES, Answer, AsyncClient, Client, DocumentLike,
                      build_request)

__all__ = ["Answer", "AsyncClient", "Client", "DEFAULT_TARGET", "DocumentLike", "MODES",
           "build_request", "pb2"]
__version__ = "0.1.0"
