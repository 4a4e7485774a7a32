// The sim's 8-bit matrix-vector op (ort_gemv.cpp), described for explain() and tests.
#pragma once

#include <cstdint>

namespace torch_fl {

// Which form the Gemv ops use here: "vnni" or "portable" (the plain loop).
const char* gemv_kernel();

// How many pieces (runs of whole 64-column tiles) the Gemv ops' calls split into, in this
// process: for tests.
uint64_t gemv_pieces();

}  // namespace torch_fl
