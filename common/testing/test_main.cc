// main() of the test binaries: GoogleTest's own, after OpenBLAS is given its native kernels.
#include "common/native_blas.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  lazyrag::PreferNativeBlasKernels(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
