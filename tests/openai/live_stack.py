"""A live lazyrag stack on loopback for the client tests (the openai SDK, the installable
Python package, the Go client): one CPU lazyrag-worker with an embedded store and a
lazyrag-router serving gRPC and the OpenAI-compatible HTTP API, on ports they pick.

    with LiveStack(router_binary, worker_binary) as stack:
        stack.grpc_target    # "127.0.0.1:PORT" (router gRPC)
        stack.http_base      # "http://127.0.0.1:PORT" (router HTTP)

The model: $LAZYRAG_MODEL, else the bundled SmolLM2 GGUF in ~/.cache/lazyrag when present,
else synthetic:tiny (answers are noise; token counts and caching behave the same).
Run as a script it starts a stack, prints "grpc=... http=..." and waits for stdin to close.
"""

import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time

DEFAULT_MODEL = os.path.expanduser("~/.cache/lazyrag/SmolLM2-135M-Instruct.Q4_1.gguf")


def model_path() -> str:
    m = os.environ.get("LAZYRAG_MODEL", "")
    if m:
        return m
    return DEFAULT_MODEL if os.path.isfile(DEFAULT_MODEL) else "synthetic:tiny"


class Process:
    """A child process whose stdout "NAME ready grpc=HOST:PORT metrics=PORT [http=PORT]" line
    is awaited; its stderr goes to a log file."""

    def __init__(self, argv, log_path):
        self.argv = argv
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     stderr=self.log)

    def wait_ready(self, timeout=120.0) -> dict:
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
                    return dict(f.split("=", 1) for f in line.split() if "=" in f)
        with open(self.log_path, "rb") as f:
            log = f.read()[-4000:].decode(errors="replace")
        raise RuntimeError(f"{self.argv[0]} did not become ready: {buf!r}\n{log}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


class LiveStack:
    def __init__(self, router_binary: str, worker_binary: str, *, worker_args=(),
                 router_args=()):
        self.router_binary = router_binary
        self.worker_binary = worker_binary
        self.worker_args = list(worker_args)
        self.router_args = list(router_args)
        self.processes = []
        self.tmp = None
        self.model = model_path()

    def __enter__(self) -> "LiveStack":
        self.tmp = tempfile.mkdtemp(prefix="lazyrag_stack_")
        try:
            worker = Process([self.worker_binary, "--listen=127.0.0.1:0", f"--model={self.model}",
                              "--device=cpu", f"--kvstore=embedded:{self.tmp}/kv",
                              "--metrics_port=-1", "--shutdown_grace_s=1"] + self.worker_args,
                             os.path.join(self.tmp, "worker.log"))
            self.processes.append(worker)
            self.worker_target = worker.wait_ready()["grpc"]
            router = Process([self.router_binary, "--listen=127.0.0.1:0",
                              f"--workers={self.worker_target}", "--http_listen=127.0.0.1:0",
                              "--metrics_port=0", "--poll_interval_s=0.2",
                              "--shutdown_grace_s=1"] + self.router_args,
                             os.path.join(self.tmp, "router.log"))
            self.processes.append(router)
            ready = router.wait_ready()
            self.grpc_target = ready["grpc"]
            self.http_base = f"http://127.0.0.1:{ready['http']}"
            self.metrics_url = f"http://127.0.0.1:{ready['metrics']}/metrics"
            self.wait_healthy()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def wait_healthy(self, timeout=30.0):
        """Until the router's /health says a worker is up (it polls them every 0.2 s)."""
        import urllib.error
        import urllib.request
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.http_base + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the router never reported a healthy worker")
            time.sleep(0.05)

    def metric(self, name_and_labels: str) -> float:
        """One sample of the router's /metrics; 0 when absent."""
        import urllib.request
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name_and_labels + " "):
                    return float(line.split()[-1])
        return 0.0

    def __exit__(self, *exc):
        for p in reversed(self.processes):
            p.stop()
        self.processes = []
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


if __name__ == "__main__":
    router, worker = sys.argv[1], sys.argv[2]
    with LiveStack(router, worker) as s:
        print(f"grpc={s.grpc_target} http={s.http_base}", flush=True)
        sys.stdin.read()
