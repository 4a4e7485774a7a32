// The sim's depthwise 8-bit convolution op (ort_depthwise.cpp), described for explain().
#pragma once

namespace torch_fl {

// Which form the DepthwiseConv ops use here: "avx512" or "portable" (the plain loop).
const char* depthwise_kernel();

}  // namespace torch_fl
