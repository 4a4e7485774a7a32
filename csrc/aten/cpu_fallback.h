// The boxed CPU fallback: every op without a flagos kernel runs its CPU kernel.
#pragma once

#include <string>

namespace torch_fl {

// "zero-copy" (default): the CPU kernel runs on CPU views of the device memory.
// "copy": the classic copying fallback (inputs copied out, results copied back), kept for
// measuring the difference (scripts/bench_eager.py) and as an escape hatch.
void set_fallback_mode(const std::string& mode);
std::string fallback_mode();

}  // namespace torch_fl
