// The sim's 8-bit channels-first max pool op (ort_maxpool.cpp), described for explain().
#pragma once

namespace torch_fl {

// Which form the MaxPool ops use here: "avx512" (AVX-512BW) or "portable" (the plain loop).
const char* maxpool_kernel();

}  // namespace torch_fl
