// lazyrag-fake-worker: the in-process fake of tests/router/fake_worker.h as a process, for the
// Python client test when lazyrag-worker is not part of the build.
//   lazyrag-fake-worker [--listen 127.0.0.1:PORT]
// Prints "lazyrag-fake-worker ready grpc=HOST:PORT" and serves until SIGINT or SIGTERM.
#include <signal.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "tests/router/fake_worker.h"

ABSL_FLAG(int, port, 0, "port on 127.0.0.1; 0 picks one");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  lazyrag::router::testing::FakeWorkerServer server({}, absl::GetFlag(FLAGS_port));
  if (absl::Status s = server.Start(); !s.ok()) {
    std::fprintf(stderr, "lazyrag-fake-worker: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("lazyrag-fake-worker ready grpc=%s\n", server.address().c_str());
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  server.Stop();
  return 0;
}
