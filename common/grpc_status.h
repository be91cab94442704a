// The one place where absl::Status and grpc::Status are converted (STYLE.md: errors).
// Code and message are carried over unchanged; the canonical codes share their numbers.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace lazyrag {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace lazyrag
