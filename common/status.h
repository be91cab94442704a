// Status helpers shared by every component. absl::Status inside; conversion to grpc::Status
// happens in exactly one place (common/grpc_status.h, added with the services).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define LAZYRAG_CONCAT_INNER(a, b) a##b
#define LAZYRAG_CONCAT(a, b) LAZYRAG_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::absl::Status _lazyrag_st = (expr);       \
    if (!_lazyrag_st.ok()) return _lazyrag_st; \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates an absl::StatusOr<T>, returns its status on error,
// else move-assigns the value to `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, expr) \
  LAZYRAG_ASSIGN_OR_RETURN_IMPL(LAZYRAG_CONCAT(_lazyrag_sor_, __LINE__), lhs, expr)
#define LAZYRAG_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
