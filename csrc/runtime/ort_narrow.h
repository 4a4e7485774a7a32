// The sim's 8-bit convolution op over few input channels (ort_narrow.cpp), described for
// explain().
#pragma once

#include <cstdint>

namespace torch_fl {

// Which form the NarrowConv ops use here: "vnni" (AVX512-VNNI) or "portable" (the plain loop).
const char* narrow_kernel();

// Output rows the AVX2 form computed over packed rows (no column dilation, at most 32 outputs),
// in this process.
uint64_t narrow_packed_rows();

}  // namespace torch_fl
