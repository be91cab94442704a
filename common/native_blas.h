// OpenBLAS (Debian 12 ships 0.3.21) picks its kernels from the CPU model when the library loads,
// and falls back to its SSE3 "Prescott" kernels on Intel models it does not know (Emerald
// Rapids, model 207, among them): GEMMs ~3x slower than its AVX-512 kernels on the same core.
// The choice can only be changed through OPENBLAS_CORETYPE before the library loads, so:
//
// PreferNativeBlasKernels, called first thing in main(), re-executes the program once with
// OPENBLAS_CORETYPE naming the widest kernel set the CPU runs (SkylakeX with AVX-512
// F/BW/VL/DQ/CD, Haswell with AVX2 and FMA). It returns without doing anything when
// OPENBLAS_CORETYPE is already set (an operator's choice, and the guard against a second exec),
// when the program does not link OpenBLAS, when OpenBLAS already chose a current kernel set, or
// when the CPU has neither. The exec is silent (programs whose output is parsed keep it); if it
// fails, one line on stderr says why and the program goes on with the generic kernels, which
// compute the same GEMMs, only slower. BlasCoreName() tells what runs.
#pragma once

#include <string>

namespace lazyrag {

void PreferNativeBlasKernels(char** argv);

// The kernel set OpenBLAS runs in this process ("SkylakeX", "Prescott", ...); empty when the
// program does not link OpenBLAS.
std::string BlasCoreName();

}  // namespace lazyrag
