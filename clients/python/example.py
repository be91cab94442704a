#!/usr/bin/env python3
"""Three RAG requests that share documents in different orders, through a lazyrag router (or
a worker). Prints each answer with its time to first token and cached document tokens.

    pip install ./clients/python
    python3 clients/python/example.py                 # the router on 127.0.0.1:7000
    python3 clients/python/example.py --target HOST:PORT
"""

import argparse
import sys

from lazyrag_client import DEFAULT_TARGET, Client

DOCUMENTS = [
    "The Rhine rises in the Swiss Alps and flows north to the North Sea.",
    "Basel is the Swiss city where the Rhine turns north towards Germany.",
    "The Rhine is about 1,230 kilometres long and carries barges for most of its length.",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=DEFAULT_TARGET,
                        help=f"router or worker HOST:PORT (default {DEFAULT_TARGET}, the router)")
    parser.add_argument("--max_tokens", type=int, default=32)
    args = parser.parse_args()

    a, b, c = DOCUMENTS
    requests = [
        ([a, b, c], "Where does the Rhine rise?"),
        ([c, a, b], "How long is the Rhine?"),
        ([b, c, a], "Which city does the Rhine turn north at?"),
    ]
    with Client(args.target) as client:
        for documents, question in requests:
            answer = client.generate_text(question, documents, max_tokens=args.max_tokens)
            print(f"Q: {question}")
            print(f"A: {answer.text.strip()!r}")
            u = answer.usage
            print(f"   ttft {answer.timings.ttft_ms:.1f} ms, cached document tokens "
                  f"{u.cached_document_tokens}/{u.document_tokens} (pool "
                  f"{u.pool_document_tokens}, host {u.host_document_tokens}, store "
                  f"{u.store_document_tokens}), finish {answer.finish_reason}")
        stats = client.stats()
        print(f"resident documents: {len(stats.resident_document_ids)}, running "
              f"{stats.running_requests}, waiting {stats.waiting_requests}, host tier "
              f"{stats.host_cache.used_bytes}/{stats.host_cache.capacity_bytes} bytes in "
              f"{stats.host_cache.entries} documents")
    return 0


if __name__ == "__main__":
    sys.exit(main())
