// The lifecycle every lazyrag server binary shares (kvstore, worker, router): block SIGINT and
// SIGTERM in every thread (threads inherit the mask, so this runs before the server starts
// any), ignore SIGPIPE, start the server, print one line "NAME ready grpc=HOST:PORT
// metrics=PORT[ http=PORT]" on stdout (scripts and tests wait for it), wait for a stop signal and
// shut down gracefully. Returns the process exit code: 0 after a signal, 2 when Start() rejects its
// options (INVALID_ARGUMENT), 1 for any other start failure.
//
// absl::Mutex's deadlock detection is turned off first: Debian builds absl without NDEBUG, so it is
// on by default and puts every lock of every absl::Mutex (gRPC's included) through one global
// lock-order graph behind one spin lock: ~3x the cost of a lock on one thread, ~30x with 4
// threads contending (bench/dev/mutex_cost). Tests keep it on; LAZYRAG_MUTEX_DEADLOCK_DETECTION=1
// keeps it on in a server too.
//
// `make_server` returns a std::unique_ptr<Server> where Server has
//   absl::Status Start(); std::string address() const; int metrics_port() const;
//   void Shutdown(absl::Time deadline);
#pragma once

#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"

namespace lazyrag {

namespace server_main_internal {
// The thread that sigwait()s for the stop signals. Threads started before RunServerUntilSignal
// blocked them (a library's pool created at load time, e.g. OpenBLAS's) still take SIGINT and
// SIGTERM; this handler hands such a delivery on to the waiting thread instead of letting the
// default action end the process without a graceful shutdown.
inline pthread_t signal_waiter;
inline void ForwardStopSignal(int signal_number) {
  pthread_kill(signal_waiter, signal_number);  // async-signal-safe
}
}  // namespace server_main_internal

template <typename MakeServer>
int RunServerUntilSignal(const std::string& name, MakeServer&& make_server,
                         absl::Duration shutdown_grace) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  server_main_internal::signal_waiter = pthread_self();
  struct sigaction forward = {};
  forward.sa_handler = server_main_internal::ForwardStopSignal;
  sigemptyset(&forward.sa_mask);
  sigaction(SIGINT, &forward, nullptr);
  sigaction(SIGTERM, &forward, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (const char* keep = std::getenv("LAZYRAG_MUTEX_DEADLOCK_DETECTION");
      keep == nullptr || std::strcmp(keep, "1") != 0) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }

  auto server = make_server();
  absl::Status status = server->Start();
  if (!status.ok()) {
    LOG_ERROR << name << ": " << status;
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::string http;  // servers with an HTTP API (the router's --http_listen) add its port
  if constexpr (requires { server->http_port(); }) {
    if (server->http_port() > 0) http = " http=" + std::to_string(server->http_port());
  }
  std::printf("%s ready grpc=%s metrics=%d%s\n", name.c_str(), server->address().c_str(),
              server->metrics_port(), http.c_str());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  LOG_INFO << name << ": signal " << signal_number << ", shutting down";
  server->Shutdown(absl::Now() + shutdown_grace);
  LOG_INFO << name << ": stopped";
  return 0;
}

}  // namespace lazyrag
