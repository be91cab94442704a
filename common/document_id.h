// Document ids (DESIGN section 4): SHA-256 over (model fingerprint, cache namespace, token ids).
// A document's id does not depend on its index or its neighbours in a request.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace lazyrag {

// Returns the 64-hex-character document id. Fields are length-prefixed so that no two
// different (fingerprint, namespace, tokens) triples hash the same byte stream.
std::string DocumentId(std::string_view model_fingerprint, std::string_view cache_namespace,
                       std::span<const int32_t> token_ids);

// True when `id` looks like a document id (64 lowercase hex characters).
bool IsDocumentId(std::string_view id);

}  // namespace lazyrag
