#pragma once
// The macros that turn a line of the op table (kernels/decoder_ops.def) into code. A line is
//   HETFLOW_OP(name, tail, (parameters), (arguments), bad_size, nothing_to_do, bad_input)
// or HETFLOW_KERNEL(...) with the same columns (a kernel the decoder's ops do not expose):
//  - name: the CPU reference `void name(parameters)` and its CUDA entry point `name_cuda`;
//  - tail: what the CUDA entry point takes after the reference's parameters: `stream` (a
//    CudaStream), `gemm` (a stream and the GEMM inputs' precision, fp32 by default) or
//    `scratch` (a stream and the scratch bytes, kAttentionScratchBytes by default);
//  - (arguments): the parameters' names, in order;
//  - the CUDA entry point's argument checks, three conditions over the parameters, tried in
//    this order: bad_size -> Status::invalid_value (a negative size), nothing_to_do ->
//    Status::success without touching the device (an empty output, no gradient wanted),
//    bad_input -> Status::invalid_value (a missing array, a shape the kernel cannot take).
// What the columns become, and where, is listed in kernels/README.md ("The op table").
// Namespaces in the parameters are written from hetflow (kernels::RopeFrequencies): the
// lines are expanded in hetflow::kernels, hetflow::exec and the tests.

// (a, b, c) -> a, b, c
#define HETFLOW_OP_UNPAREN(...) __VA_ARGS__

// The CUDA entry point's (and its launcher's) parameters: the reference's, then the tail's.
// _DECL gives the tail's defaults (for the one declaration), _DEF does not.
#define HETFLOW_OP_CUDA_DECL(params, tail) (HETFLOW_OP_UNPAREN params, HETFLOW_OP_TAIL_DECL_##tail)
#define HETFLOW_OP_CUDA_DEF(params, tail) (HETFLOW_OP_UNPAREN params, HETFLOW_OP_TAIL_DEF_##tail)
// The arguments that pass the entry point's parameters on to its launcher.
#define HETFLOW_OP_CUDA_ARGS(args, tail) (HETFLOW_OP_UNPAREN args, HETFLOW_OP_TAIL_ARGS_##tail)

#define HETFLOW_OP_TAIL_DECL_stream CudaStream stream
#define HETFLOW_OP_TAIL_DEF_stream CudaStream stream
#define HETFLOW_OP_TAIL_ARGS_stream stream
#define HETFLOW_OP_TAIL_DECL_gemm CudaStream stream, GemmInputs inputs = GemmInputs::fp32
#define HETFLOW_OP_TAIL_DEF_gemm CudaStream stream, GemmInputs inputs
#define HETFLOW_OP_TAIL_ARGS_gemm stream, inputs
#define HETFLOW_OP_TAIL_DECL_scratch CudaStream stream, std::size_t scratch_bytes = kAttentionScratchBytes
#define HETFLOW_OP_TAIL_DEF_scratch CudaStream stream, std::size_t scratch_bytes
#define HETFLOW_OP_TAIL_ARGS_scratch stream, scratch_bytes

// HETFLOW_OP_IF_GEMM(tail, x) is x for a gemm op, nothing otherwise; HETFLOW_OP_UNLESS_GEMM
// the reverse. (Their launchers live where cuBLAS does, and so do their stubs.)
#define HETFLOW_OP_IF_GEMM(tail, ...) HETFLOW_OP_IF_GEMM_##tail(__VA_ARGS__)
#define HETFLOW_OP_IF_GEMM_stream(...)
#define HETFLOW_OP_IF_GEMM_scratch(...)
#define HETFLOW_OP_IF_GEMM_gemm(...) __VA_ARGS__
#define HETFLOW_OP_UNLESS_GEMM(tail, ...) HETFLOW_OP_UNLESS_GEMM_##tail(__VA_ARGS__)
#define HETFLOW_OP_UNLESS_GEMM_stream(...) __VA_ARGS__
#define HETFLOW_OP_UNLESS_GEMM_scratch(...) __VA_ARGS__
#define HETFLOW_OP_UNLESS_GEMM_gemm(...)
