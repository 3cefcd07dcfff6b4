/* Python bindings of our CPU primitives (cpu_prims.h), for mlx_lm_batched/_cpu_prims.py. */
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <cstdint>

#include "cpu_prims.h"
#include "shared_work.h"

namespace nb = nanobind;

NB_MODULE(_mlxlmb_cpu_prims, m) {
  m.doc() = "MLX primitives for the CPU backend (mlx_lm_batched)";
  m.def("decode_attention", &mlxlmb::decode_attention, nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("scale"), nb::arg("mask") = nb::none(),
        "softmax(q k^T * scale) v for one query per row (float32, float16 or bfloat16).");
  m.def("decode_attention_segments", &mlxlmb::decode_attention_segments, nb::arg("q"),
        nb::arg("keys"), nb::arg("values"), nb::arg("scale"), nb::arg("mask") = nb::none(),
        "decode_attention over keys and values held in segments of consecutive slots.");
  m.def("set_shared_work", &mlxlmb::set_shared_work_enabled, nb::arg("enabled"),
        "Helpers that need not all arrive (True) or OpenMP's parallel for (False).");
  m.def("share_chunks_address", [] {
    void (*share)(int, int, void (*)(void*, int), void*) = &mlxlmb::share_chunks;
    return reinterpret_cast<uintptr_t>(share);
  }, "The address of share_chunks (shared_work.h), for the small-row matmul library.");
  m.def("set_threads", &mlxlmb::set_attention_threads, nb::arg("threads"),
        "Threads decode_attention's tasks are split over.");
  m.def("rms_norm", &mlxlmb::rms_norm, nb::arg("x"), nb::arg("weight") = nb::none(),
        nb::arg("eps"), "RMS norm over the last axis (float32, float16 or bfloat16).");
  m.def("rope", &mlxlmb::rope, nb::arg("x"), nb::arg("dims"), nb::arg("traditional"),
        nb::arg("inv_freq"), nb::arg("scale"), nb::arg("offset"),
        "Rotary embedding with per-row offsets (float32, float16 or bfloat16).");
  m.def("linear", &mlxlmb::linear, nb::arg("x"), nb::arg("weight"),
        nb::arg("bias") = nb::none(), "x @ weight.T (+ bias) as one node (float32).");
  m.def("half_linear", &mlxlmb::half_linear, nb::arg("x"), nb::arg("weight"),
        nb::arg("bias") = nb::none(),
        "x @ weight.T (+ bias) for a float16 or bfloat16 weight, computed in float32.");
  m.def("swiglu", &mlxlmb::swiglu, nb::arg("gate"), nb::arg("up"),
        "silu(gate) * up as one node (float32, float16 or bfloat16).");
  m.def("quantized_linear", &mlxlmb::quantized_linear, nb::arg("x"), nb::arg("w"),
        nb::arg("scales"), nb::arg("biases"), nb::arg("bias") = nb::none(),
        nb::arg("group_size"), nb::arg("bits"),
        "x @ dequantize(w)^T (+ bias), affine 4 or 8 bits (float32, float16 or bfloat16 x).");
  m.def("quantized_linears", &mlxlmb::quantized_linears, nb::arg("x"), nb::arg("ws"),
        nb::arg("scales"), nb::arg("biases"), nb::arg("bias"), nb::arg("group_size"),
        nb::arg("bits"), "quantized_linear of several layers of one input, in one node.");
  m.def("block_size", &mlxlmb::block_size, nb::arg("length"), nb::arg("other"), nb::arg("K"),
        nb::arg("threads"), nb::arg("least") = 1,
        "Rows (or columns) per block when `length` of them, `other` wide, are split over "
        "threads, each block at least `least` long (`length`: not split).");
  m.def("linear_available", &mlxlmb::linear_available,
        "Whether cblas_sgemm can be found in the process.");
}
