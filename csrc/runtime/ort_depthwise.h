// The sim's depthwise 8-bit convolution op (ort_depthwise.cpp), described for explain().
#pragma once

#include <cstdint>

namespace torch_fl {

// Which form the DepthwiseConv ops use here: "avx512" or "portable" (the plain loop).
const char* depthwise_kernel();

// How many pieces (runs of output rows, ort_kernel.h) the DepthwiseConv and GroupedConv ops'
// calls split into, in this process: for tests.
uint64_t depthwise_pieces();

}  // namespace torch_fl
