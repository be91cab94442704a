#include "common/metrics_http.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>

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
