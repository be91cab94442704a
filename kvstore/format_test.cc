#include "kvstore/format.h"

#include <gtest/gtest.h>

namespace lazyrag::kvstore {
namespace {

namespace pb = lazyrag::v1;

pb::KvKey Doc(const std::string& fp, const std::string& ns, const std::string& id) {
  pb::KvKey k;
  k.mutable_document()->set_model_fingerprint(fp);
  k.mutable_document()->set_cache_namespace(ns);
  k.mutable_document()->set_document_id(id);
  return k;
}

TEST(FormatTest, KeyEncodingIsCanonicalAndUnambiguous) {
  auto a = EncodeKey(Doc("ab", "c", "d"));
  auto b = EncodeKey(Doc("a", "bc", "d"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(*a, std::string("D\0\0\0\2ab\0\0\0\1c\0\0\0\1d", 17));
  pb::KvKey raw;
  raw.set_raw("ab");
  EXPECT_EQ(*EncodeKey(raw), "Rab");
  for (const pb::KvKey& k : {Doc("fp", "", "id"), raw}) {
    auto decoded = DecodeKey(*EncodeKey(k));
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(decoded->SerializeAsString(), k.SerializeAsString());
  }
  EXPECT_EQ(DescribeKey(*a), "doc:ab/c/d");
  EXPECT_FALSE(DecodeKey("D\0\0").ok());
  // What EncodeKey refuses does not decode either (found by kv_format_fuzzer): an empty
  // document id or fingerprint, an oversized raw key.
  EXPECT_FALSE(DecodeKey(std::string("D\0\0\0\2fp\0\0\0\0\0\0\0\0", 15)).ok());
  EXPECT_FALSE(DecodeKey(std::string("D\0\0\0\0\0\0\0\0\0\0\0\2id", 15)).ok());
  EXPECT_FALSE(DecodeKey("R" + std::string(kMaxKeyBytes, 'x')).ok());
}

TEST(FormatTest, BadKeys) {
  pb::KvKey none, empty_raw, big;
  empty_raw.set_raw("");
  big.set_raw(std::string(kMaxKeyBytes, 'x'));  // + 1 tag byte: over the limit
  for (const pb::KvKey& k : {none, empty_raw, big, Doc("", "ns", "id"), Doc("fp", "ns", "")}) {
    EXPECT_EQ(EncodeKey(k).status().code(), absl::StatusCode::kInvalidArgument);
  }
  big.set_raw(std::string(kMaxKeyBytes - 1, 'x'));
  EXPECT_TRUE(EncodeKey(big).ok());
}

pb::ValueHeader Header(uint64_t size, uint32_t chunk) {
  pb::ValueHeader h;
  h.set_total_size(size);
  h.set_chunk_size(chunk);
  h.set_num_chunks(NumChunks(size, chunk));
  return h;
}

TEST(FormatTest, LayoutValidation) {
  EXPECT_EQ(NumChunks(0, 10), 0u);
  EXPECT_EQ(NumChunks(10, 10), 1u);
  EXPECT_EQ(NumChunks(11, 10), 2u);
  EXPECT_EQ(NumChunks(256ull << 20, kDefaultChunkBytes), 128u);
  auto ok = LayoutFromProto(Header(25, 10));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->ChunkEnd(2), 25u);
  EXPECT_EQ(ok->ChunkBegin(2), 20u);
  std::vector<pb::ValueHeader> bad = {Header(10, 0), Header(10, kMaxChunkBytes + 1),
                                      Header(kMaxValueBytes + 1, kMaxChunkBytes)};
  bad.push_back(Header(25, 10));
  bad.back().set_num_chunks(2);
  bad.push_back(Header(25, 10));
  bad.back().set_metadata(std::string(kMaxMetadataBytes + 1, 'm'));
  bad.push_back(Header(25, 10));
  bad.back().add_layer_offsets(1);  // must start at 0
  bad.push_back(Header(25, 10));
  bad.back().add_layer_offsets(0);
  bad.back().add_layer_offsets(26);  // beyond the value
  bad.push_back(Header(25, 10));
  bad.back().add_layer_offsets(0);
  bad.back().add_layer_offsets(10);
  bad.back().add_layer_offsets(5);  // decreasing
  bad.push_back(Header(25, 10));
  bad.back().set_checksum_algorithm(static_cast<pb::ChecksumAlgorithm>(7));
  for (const auto& h : bad) {
    EXPECT_EQ(LayoutFromProto(h).status().code(), absl::StatusCode::kInvalidArgument)
        << h.ShortDebugString();
  }
}

TEST(FormatTest, LayerRanges) {
  ValueLayout layout;
  layout.total_size = 100;
  layout.layer_offsets = {0, 10, 10, 60};
  auto whole = LayerRange(layout, 0, 0);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->end, 100u);
  auto r = LayerRange(layout, 1, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->begin, 10u);
  EXPECT_EQ(r->end, 60u);
  r = LayerRange(layout, 3, 1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->begin, 60u);
  EXPECT_EQ(r->end, 100u);
  EXPECT_EQ(LayerRange(layout, 3, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(LayerRange(layout, 1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  layout.layer_offsets.clear();
  EXPECT_EQ(LayerRange(layout, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazyrag::kvstore
