// The sim's exact 8-bit GEMM op on 16-bit products (ort_pair_gemm.cpp), described for explain().
#pragma once

#include <cstdint>

namespace torch_fl {

// Which form the PairGemm ops use here: "avx2" or "portable" (the plain loop).
const char* pair_gemm_kernel();

// How many pieces the PairGemm ops' calls split into, in this process.
uint64_t pair_gemm_pieces();

}  // namespace torch_fl
