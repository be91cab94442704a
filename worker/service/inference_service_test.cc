// Request validation of the gRPC adapter: every bad input gets INVALID_ARGUMENT
// and a reason.
#include "worker/service/inference_service.h"

#include <cmath>

#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"

namespace lazyrag {
namespace {

v1::GenerateRequest Good() {
  v1::GenerateRequest r;
  r.set_query("what?");
  r.set_max_tokens(8);
  r.add_documents()->set_text("a document");
  return r;
}

void ExpectInvalid(const v1::GenerateRequest &r, const std::string &needle) {
  auto parsed = ParseGenerateRequest(r, InferenceServiceOptions{});
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find(needle), std::string::npos) << parsed.status();
}

TEST(ParseGenerateRequestTest, AcceptsAGoodRequest) {
  auto parsed = ParseGenerateRequest(Good(), InferenceServiceOptions{});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->max_tokens, 8);
  EXPECT_EQ(parsed->sampling.top_p, 1.0f);  // 0 (unset) means 1
  EXPECT_EQ(parsed->mode, AttentionMode::kLazy);
}

TEST(ParseGenerateRequestTest, RejectsBadInput) {
  auto r = Good();
  r.set_query("");
  ExpectInvalid(r, "query is empty");
  r = Good();
  r.set_max_tokens(0);
  ExpectInvalid(r, "max_tokens");
  r.set_max_tokens(1 << 30);
  ExpectInvalid(r, "max_tokens");
  r = Good();
  r.mutable_sampling()->set_temperature(NAN);
  ExpectInvalid(r, "temperature");
  r.mutable_sampling()->set_temperature(-1);
  ExpectInvalid(r, "temperature");
  r = Good();
  r.set_mode(static_cast<v1::AttentionMode>(9));
  ExpectInvalid(r, "unknown mode 9");
  for (int k : {-1, 513, 1 << 30}) {
    r = Good();
    r.mutable_quality()->mutable_recompute_first_tokens()->set_value(k);
    ExpectInvalid(r, "quality.recompute_first_tokens must be in 0 .. 512");
  }
  // A quality option this worker does not know (a newer client's field 99) is refused.
  r = Good();
  r.mutable_quality()->GetReflection()->MutableUnknownFields(r.mutable_quality())->AddVarint(99,
                                                                                            1);
  ExpectInvalid(r, "quality: unknown option (field 99)");
  r = Good();
  {
    auto unset = ParseGenerateRequest(r, InferenceServiceOptions{});
    ASSERT_TRUE(unset.ok());
    EXPECT_FALSE(unset->quality.recompute_first_tokens.has_value());  // the worker's default
  }
  r.mutable_quality()->mutable_document_temperature()->set_value(0);
  ExpectInvalid(r, "quality.document_temperature must be in [0.05, 20]");
  r.mutable_quality()->mutable_document_temperature()->set_value(0.9f);
  r.mutable_quality()->mutable_document_scale()->set_value(1000);
  ExpectInvalid(r, "quality.document_scale must be in [0.01, 100]");
  r.mutable_quality()->mutable_document_scale()->set_value(1.5f);
  r.mutable_quality()->mutable_recompute_first_tokens()->set_value(16);
  {
    auto set = ParseGenerateRequest(r, InferenceServiceOptions{});
    ASSERT_TRUE(set.ok());
    EXPECT_EQ(set->quality.recompute_first_tokens, 16);
    EXPECT_EQ(set->quality.document_temperature, 0.9f);
    EXPECT_EQ(set->quality.document_scale, 1.5f);
    EXPECT_FALSE(set->quality.drop_first_tokens.has_value());
  }
  r.mutable_quality()->mutable_drop_first_tokens()->set_value(2);
  ExpectInvalid(r, "drop_first_tokens (2) and recompute_first_tokens (16) exclude each other");
  r.mutable_quality()->clear_recompute_first_tokens();
  r.mutable_quality()->mutable_drop_first_tokens()->set_value(65);
  ExpectInvalid(r, "quality.drop_first_tokens must be in 0 .. 64");
  r.mutable_quality()->mutable_drop_first_tokens()->set_value(2);
  {
    auto set = ParseGenerateRequest(r, InferenceServiceOptions{});
    ASSERT_TRUE(set.ok());
    EXPECT_EQ(set->quality.drop_first_tokens, 2);
  }
  r = Good();
  r.add_documents();
  ExpectInvalid(r, "set text or id");
  r = Good();
  r.set_query("bad \xff utf8");
  ExpectInvalid(r, "UTF-8");
  r = Good();
  r.add_stop("");
  ExpectInvalid(r, "stop");
}

}  // namespace
}  // namespace lazyrag
