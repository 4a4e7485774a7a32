// The sim's 8-bit convolution op over few input channels (ort_narrow.cpp), described for
// explain().
#pragma once

namespace torch_fl {

// Which form the NarrowConv ops use here: "vnni" (AVX512-VNNI) or "portable" (the plain loop).
const char* narrow_kernel();

}  // namespace torch_fl
