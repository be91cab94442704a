// RuntimeOptions::host_cache_bytes: the machine-sized default, 0 and explicit sizes, and the
// INVALID_ARGUMENT of a value below -1 (before the model is loaded). RuntimeOptions::quality:
// the "measured" values -1 resolve to the engine's server defaults.
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

// -1 ("measured", the worker's default for --drop_first_tokens) becomes
// kMeasuredDropFirstTokens, unless first-k recompute is set, which it excludes; explicit values
// stay.
TEST(QualityDefaultsTest, MeasuredValuesResolveAndExcludeEachOther) {
  auto engine_quality = [](int k, int d) -> QualitySettings {
    RuntimeOptions o;
    o.model = "synthetic:tiny";
    o.kv_pool_bytes = 8 << 20;
    o.host_cache_bytes = 0;
    o.quality.recompute_first_tokens = k;
    o.quality.drop_first_tokens = d;
    auto rt = CreateRuntime(o);
    EXPECT_TRUE(rt.ok()) << rt.status();
    return rt.ok() ? (*rt)->engine->options().quality : QualitySettings{};
  };
  QualitySettings q = engine_quality(0, -1);
  EXPECT_EQ(q.drop_first_tokens, kMeasuredDropFirstTokens);
  EXPECT_EQ(q.recompute_first_tokens, 0);
  q = engine_quality(0, 0);  // plain LAZY
  EXPECT_EQ(q.drop_first_tokens, 0);
  q = engine_quality(0, 5);
  EXPECT_EQ(q.drop_first_tokens, 5);
  q = engine_quality(8, -1);  // first-k chosen: no drop
  EXPECT_EQ(q.drop_first_tokens, 0);
  EXPECT_EQ(q.recompute_first_tokens, 8);
  q = engine_quality(-1, -1);
  EXPECT_EQ(q.recompute_first_tokens, kMeasuredRecomputeFirstTokens);
  EXPECT_EQ(q.drop_first_tokens, 0);
  EXPECT_GT(kMeasuredDropFirstTokens, 0);
}

}  // namespace
}  // namespace lazyrag
