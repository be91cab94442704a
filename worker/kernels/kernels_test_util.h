// Test-only device helpers for kernels_test (compiled with nvcc, linked into the test only).
#pragma once

#include <cstdint>

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace lazyrag::kernels::testing {

// Writes `rows` rows of `row_elems` bf16 values (k_rows/v_rows, row i) to the pools at
// element offsets offsets[i] (k_cache + offsets[i], v_cache + offsets[i]), after spinning for
// `delay_ns` on the global timer. Launched without the programmatic attribute (it runs after
// everything before it on the stream) and lets its programmatic dependents start at once
// (griddepcontrol.launch_dependents first): the next attention kernel runs its pre-wait part
// while the rows are still unwritten, as it would beside the model's QKV scatter. Returns false
// when the launch fails.
bool LaunchDelayedRowWrite(uint16_t* k_cache, uint16_t* v_cache, const int64_t* offsets,
                           const uint16_t* k_rows, const uint16_t* v_rows, int rows, int row_elems,
                           int64_t delay_ns, cudaStream_t stream);

}  // namespace lazyrag::kernels::testing
