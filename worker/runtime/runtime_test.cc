// RuntimeOptions::host_cache_bytes: the machine-sized default, 0 and explicit sizes, and the
// INVALID_ARGUMENT of a value below -1 (before the model is loaded).
#include "worker/runtime/runtime.h"

#include "gtest/gtest.h"

namespace lazyrag {
namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

TEST(HostCacheBytesTest, DefaultIsAQuarterOfMemoryOnCudaCappedAndZeroOnCpu) {
  EXPECT_EQ(DefaultHostCacheBytes("cuda", 64 * kGiB), 16 * kGiB);
  EXPECT_EQ(DefaultHostCacheBytes("cuda", 2048 * kGiB), kMaxDefaultHostCacheBytes);
  EXPECT_EQ(kMaxDefaultHostCacheBytes, 64 * kGiB);
  EXPECT_EQ(DefaultHostCacheBytes("cuda", 0), 0);  // memory unknown: no tier
  EXPECT_EQ(DefaultHostCacheBytes("cpu", 64 * kGiB), 0);
}

TEST(HostCacheBytesTest, ResolveKeepsExplicitValuesOnEveryDevice) {
  EXPECT_EQ(*ResolveHostCacheBytes(-1, "cuda", 64 * kGiB), 16 * kGiB);
  EXPECT_EQ(*ResolveHostCacheBytes(-1, "cpu", 64 * kGiB), 0);
  EXPECT_EQ(*ResolveHostCacheBytes(0, "cuda", 64 * kGiB), 0);
  EXPECT_EQ(*ResolveHostCacheBytes(12345, "cpu", 64 * kGiB), 12345);
  EXPECT_EQ(*ResolveHostCacheBytes(100 * kGiB, "cuda", 64 * kGiB), 100 * kGiB);
}

TEST(HostCacheBytesTest, BelowMinusOneIsInvalidArgument) {
  auto r = ResolveHostCacheBytes(-5, "cpu", 64 * kGiB);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("host_cache_bytes"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("-5"), std::string::npos) << r.status();

  RuntimeOptions o;
  o.model = "/nonexistent/model.gguf";  // never loaded: the options are checked first
  o.host_cache_bytes = -2;
  auto rt = CreateRuntime(o);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument) << rt.status();
}

TEST(HostCacheBytesTest, MachineMemoryIsKnownHere) { EXPECT_GT(MachineMemoryBytes(), 0); }

TEST(HostCacheBytesTest, RuntimeBuildsTheEngineHostTier) {
  RuntimeOptions o;
  o.model = "synthetic:tiny";
  o.kv_pool_bytes = 8 << 20;
  auto off = CreateRuntime(o);  // -1 on the CPU: no tier
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ((*off)->engine->host_tier(), nullptr);
  o.host_cache_bytes = 1 << 20;
  auto on = CreateRuntime(o);
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_NE((*on)->engine->host_tier(), nullptr);
  EXPECT_GT((*on)->engine->Stats().host.capacity_bytes, 0);
  EXPECT_LE((*on)->engine->Stats().host.capacity_bytes, 1 << 20);
}

}  // namespace
}  // namespace lazyrag
