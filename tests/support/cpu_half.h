// Whether this libtorch runs the example GPT's forward in fp16 on the CPU. libtorch 1.13 lacks
// CPU Half kernels for some of its ops ("not implemented for 'Half'"), and the engine turns that
// error into one naming fp16.enabled and suggesting bf16; libtorch 2.x has them, and fp16 then
// trains on the CPU like any other dtype. Tests of either behaviour ask this first.
#pragma once

namespace dstest {

bool cpu_runs_the_gpt_in_fp16();

}  // namespace dstest
