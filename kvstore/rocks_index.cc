#include "kvstore/rocks_index.h"

#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "rocksdb/write_batch.h"

namespace lazyrag::kvstore {
namespace {

void AppendU32(uint32_t v, std::string* out) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
}
uint32_t ReadU32(const char* p) {
  const auto* u = reinterpret_cast<const uint8_t*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | u[3];
}
std::string TaggedKey(char tag, std::string_view key) {
  std::string out(1, tag);
  out.append(key);
  return out;
}

}  // namespace

void AppendU64(uint64_t v, std::string* out) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
}
uint64_t ReadU64(const char* p) { return (uint64_t{ReadU32(p)} << 32) | ReadU32(p + 4); }
std::string ValueKey(std::string_view key) { return TaggedKey(kValueTag, key); }
std::string AccessKey(std::string_view key) { return TaggedKey(kAccessTag, key); }

std::string EncodeValueRecord(uint64_t gen, const ValueLayout& layout,
                              std::span<const uint32_t> crcs) {
  std::string out;
  AppendU64(gen, &out);
  AppendU32(static_cast<uint32_t>(crcs.size()), &out);
  for (uint32_t crc : crcs) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(crc >> (8 * i)));
  }
  lazyrag::v1::ValueHeader header;
  LayoutToProto(layout, &header);
  header.AppendToString(&out);
  return out;
}

absl::Status DecodeValueRecord(std::string_view record, ValueRecord* out) {
  if (record.size() < 12) return absl::DataLossError("stored header truncated");
  out->gen = ReadU64(record.data());
  const uint32_t n = ReadU32(record.data() + 8);
  if (record.size() < 12 + uint64_t{n} * 4) return absl::DataLossError("stored header truncated");
  out->crcs.resize(n);
  const auto* p = reinterpret_cast<const uint8_t*>(record.data() + 12);
  for (uint32_t i = 0; i < n; ++i, p += 4) {
    out->crcs[i] =
        uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
  }
  const size_t proto_at = 12 + size_t{n} * 4;
  lazyrag::v1::ValueHeader header;
  if (!header.ParseFromArray(record.data() + proto_at,
                             static_cast<int>(record.size() - proto_at))) {
    return absl::DataLossError("stored header unreadable");
  }
  auto parsed = LayoutFromProto(header);
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat("stored header invalid: ", parsed.status().message()));
  }
  if (parsed->num_chunks != n) return absl::DataLossError("stored header: checksum count");
  out->layout = *std::move(parsed);
  return absl::OkStatus();
}

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(std::string(what), ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain() || s.IsShutdownInProgress()) {
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

absl::Status DropLegacyRows(rocksdb::DB* db) {
  uint64_t dropped = 0;
  for (char tag : {kLegacyHeaderTag, kLegacyChunkTag}) {
    const std::string begin(1, tag), end(1, static_cast<char>(tag + 1));
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    it->Seek(begin);
    if (!it->Valid() || it->key()[0] != tag) {
      RETURN_IF_ERROR(FromRocks(it->status(), "scanning old rows"));
      continue;
    }
    if (tag == kLegacyHeaderTag) {
      for (; it->Valid() && it->key()[0] == tag; it->Next()) ++dropped;
    }
    it.reset();
    RETURN_IF_ERROR(
        FromRocks(db->DeleteRange(rocksdb::WriteOptions(), db->DefaultColumnFamily(), begin, end),
                  "dropping old rows"));
  }
  if (dropped > 0) {
    LOG_WARNING << "kvstore: dropped " << dropped
                << " values stored in the earlier format (chunks in RocksDB); they are recomputed";
  }
  return absl::OkStatus();
}

absl::Status RebuildIndexFromFiles(rocksdb::DB* db, const ValueFiles& files, int64_t now_ms) {
  ASSIGN_OR_RETURN(const std::vector<uint64_t> gens, files.Generations());
  std::map<std::string, std::pair<uint64_t, std::string>> newest;  // key -> (gen, record)
  uint64_t unreadable = 0;
  for (uint64_t gen : gens) {
    auto fd = files.OpenForRead(gen);
    absl::StatusOr<Trailer> trailer = fd.ok() ? ReadTrailer(fd->get()) : fd.status();
    ValueRecord record;
    if (!trailer.ok() || !DecodeValueRecord(trailer->record, &record).ok() || record.gen != gen) {
      ++unreadable;  // left unreferenced: deleted by the load
      continue;
    }
    auto& slot = newest[trailer->key];
    if (slot.second.empty() || slot.first < gen) slot = {gen, std::move(trailer->record)};
  }
  rocksdb::WriteBatch batch;
  std::string access;
  AppendU64(static_cast<uint64_t>(now_ms), &access);
  for (const auto& [key, value] : newest) {
    batch.Put(ValueKey(key), value.second);
    batch.Put(AccessKey(key), access);
  }
  rocksdb::WriteOptions sync;
  sync.sync = true;
  RETURN_IF_ERROR(FromRocks(db->Write(sync, &batch), "writing the rebuilt index"));
  LOG_WARNING << "kvstore: rebuilt the index: " << newest.size() << " values from " << gens.size()
              << " files (" << unreadable << " without a readable trailer)";
  return absl::OkStatus();
}

}  // namespace lazyrag::kvstore
