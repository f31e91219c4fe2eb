// A module of FlashInfer's SM90 mixed-GEMM weight interleave kernels alone, for
// benchmarks/flashinfer_conformance.py --interleave-alone.
//
// FlashInfer 0.7.2 exports `interleave_moe_weights_for_sm90_mixed_gemm` from its whole
// CUTLASS fused-MoE module (`fused_moe_90`), whose build takes longer than one call of the
// lent GPU allows. The kernels themselves live in one file of FlashInfer's package,
// csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu,
// which is compiled unchanged beside this file. This binding takes the same arguments as
// FlashInfer's export (weight, output, quant type 0 int4 / 1 fp4 / 2 fp4 for FP8), checks
// them alike, and runs the interleave of each expert in turn on the tensor's stream.

#include "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.h"
#include "tvm_ffi_utils.h"

namespace kernels = tensorrt_llm::kernels::cutlass_kernels;

void interleave_moe_weights_for_sm90_mixed_gemm(TensorView weight, TensorView out,
                                                int64_t quant_type) {
  CHECK_INPUT_TYPE(weight, dl_uint8);
  CHECK_INPUT_TYPE(out, dl_uint8);
  CHECK_CONTIGUOUS(weight);
  CHECK_CONTIGUOUS(out);
  CHECK_DIM(3, weight);
  CHECK_DIM(3, out);
  for (int d = 0; d < 3; ++d) {
    TVM_FFI_ICHECK_EQ(weight.size(d), out.size(d)) << "weight and out differ in dim " << d;
  }
  TVM_FFI_ICHECK(quant_type >= 0 && quant_type <= 2)
      << "quant_type must be 0 (int4), 1 (fp4) or 2 (fp4 for fp8), got " << quant_type;
  int64_t const experts = weight.size(0);
  int64_t const rows = weight.size(1);
  int64_t const cols = weight.size(2) * 2;  // logical k: two 4-bit values per byte
  TVM_FFI_ICHECK_EQ(rows % 16, 0) << "n must be a multiple of 16";
  TVM_FFI_ICHECK_EQ(cols % 64, 0) << "k must be a multiple of 64";
  int64_t const stride = rows * (cols / 2);
  cudaStream_t stream = get_stream(weight.device());
  auto* src = static_cast<uint8_t*>(weight.data_ptr());
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t e = 0; e < experts; ++e) {
    uint8_t* s = src + e * stride;
    uint8_t* o = dst + e * stride;
    int const n = static_cast<int>(rows);
    int const k = static_cast<int>(cols);
    if (quant_type == 0) {
      kernels::interleave_int4_weights_for_sm90_mixed_gemm(s, o, n, k, stream);
    } else if (quant_type == 1) {
      kernels::interleave_fp4_weights_for_sm90_mixed_gemm(s, o, n, k, stream);
    } else {
      kernels::interleave_fp4_fp8_weights_for_sm90_mixed_gemm(s, o, n, k, stream);
    }
  }
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(interleave_moe_weights_for_sm90_mixed_gemm,
                              interleave_moe_weights_for_sm90_mixed_gemm);
