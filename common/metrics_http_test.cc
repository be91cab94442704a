#include "common/metrics_http.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

namespace lazyrag::metrics {
namespace {

TEST(MetricsHttpTest, ServesRegistryOnPickedPort) {
  Registry registry;
  registry.AddCounter("lazyrag_test_total", "t").Add({{"k", "v"}}).Increment(7);
  MetricsHttpServer server(&registry, {.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(server.Start().ok());
  ASSERT_GT(server.port(), 0);
  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("lazyrag_test_total{k=\"v\"} 7\n"), std::string::npos) << res->body;
  EXPECT_NE(res->get_header_value("Content-Type").find("version=0.0.4"), std::string::npos);
  EXPECT_EQ(client.Get("/other")->status, 404);
  server.Stop();
  server.Stop();
}

// Every server's /metrics carries lazyrag_build_info and the process metrics (issue 27).
TEST(MetricsHttpTest, ServesBuildInfoAndProcessMetrics) {
  Registry registry;
  MetricsHttpServer server(&registry, {.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(server.Start().ok());
  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  const std::string& body = res->body;
  EXPECT_NE(body.find("# TYPE lazyrag_build_info gauge\nlazyrag_build_info{version=\""),
            std::string::npos)
      << body;
  EXPECT_NE(body.find("\"} 1\n"), std::string::npos) << body;
#if defined(__linux__)
  for (const char* name : {"process_resident_memory_bytes ", "process_cpu_seconds_total ",
                           "process_open_fds ", "process_start_time_seconds ",
                           "process_virtual_memory_bytes ", "process_max_fds "}) {
    const size_t at = body.find(std::string("\n") + name);
    ASSERT_NE(at, std::string::npos) << name << "\n" << body;
    const double value = std::strtod(body.c_str() + at + 1 + std::strlen(name), nullptr);
    // A fresh test process may not have used a clock tick of CPU yet.
    if (std::strcmp(name, "process_cpu_seconds_total ") == 0) {
      EXPECT_GE(value, 0) << name;
    } else {
      EXPECT_GT(value, 0) << name;
    }
  }
  // Started within the last day, not in the future (seconds since the epoch).
  const size_t at = body.find("\nprocess_start_time_seconds ");
  const double start = std::strtod(body.c_str() + at + 28, nullptr);
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(start, now + 2);
  EXPECT_GT(start, now - 86400);
#endif
}

TEST(MetricsHttpTest, StopRightAfterStartDoesNotHang) {
  Registry registry;
  for (int i = 0; i < 5; ++i) {
    MetricsHttpServer server(&registry, {.host = "127.0.0.1", .port = 0});
    ASSERT_TRUE(server.Start().ok());
  }
}

// A client that asks for keep-alive gets "Connection: close", so it holds no handler thread and
// Stop() does not wait out httplib's 5 s keep-alive timeout (it did before).
TEST(MetricsHttpTest, KeepAliveClientDoesNotDelayStop) {
  Registry registry;
  MetricsHttpServer server(&registry, {.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(server.Start().ok());
  httplib::Client client("127.0.0.1", server.port());
  client.set_keep_alive(true);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->get_header_value("Connection"), "close");
  const auto t0 = std::chrono::steady_clock::now();
  server.Stop();
  const double stop_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(stop_s, 2.5) << "Stop() waited for the idle keep-alive connection";
}

}  // namespace
}  // namespace lazyrag::metrics
