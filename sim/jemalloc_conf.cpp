// jemalloc's options, compiled into every program that links the simulator and with it
// jemalloc (sim/CMakeLists.txt); jemalloc reads them once, when it starts.
//
// oversize_threshold:0 keeps allocations of 8 MiB and more in the ordinary arenas, whose
// freed pages wait 10 s before they go back to the system, instead of a dedicated arena that
// returns them at once. The CPU executor frees and allocates its large activation buffers
// (a GPT's logits and their gradient) every step; returned at once, they were faulted in
// again each time. Measured (tests/bench/training_bench, medians of 5 on an idle machine):
// one device's step 1.00x PyTorch's tokens/s before, 1.09x after; Megatron's Table 1 rows
// 8-10 simulate in the same time and peak memory either way.
extern "C" {
// NOLINTNEXTLINE: jemalloc looks this name up (its documented way for a program to set options)
const char* malloc_conf = "oversize_threshold:0";
}
