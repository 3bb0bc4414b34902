// The op schemas, torch.ops.hybridrl_cpu.*, and their CPU implementations.
#include <torch/library.h>

#include <string>

#include "kernels.h"

TORCH_LIBRARY(hybridrl_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("sample_rows(Tensor logits, float inv_temperature, Tensor u) -> (Tensor, Tensor)");
  m.def("token_logprobs(Tensor logits, float inv_temperature, Tensor ids) -> Tensor");
  m.def("rotary(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("linear_native() -> bool", hybridrl::linear_native);
  m.def("linear_f32_native() -> bool", hybridrl::linear_f32_native);
  m.def("isa() -> str", [] { return std::string(hybridrl::kernel_isa()); });
  m.def("pack_linear(Tensor weight) -> Tensor");
  m.def("pack_linear_into(Tensor(a!) packed, Tensor weight, int row0, int rows) -> ()");
  m.def("load_linear_rows(Tensor(a!) packed, Tensor(b!)? param, Tensor src, int row0, int rows) -> ()");
  m.def("unpack_linear(Tensor packed, int row0, int rows, int out_features, int in_features) -> Tensor");
  m.def("linear_packed(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  m.def("train_attention_fwd(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> (Tensor, Tensor)");
  m.def("train_attention_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor mask, "
        "float scale) -> (Tensor, Tensor, Tensor)");
  m.def("head_fold(Tensor logits, int v0, Tensor(a!) peak, Tensor(b!) total, Tensor(c!) moment, bool with_moment, "
        "Tensor row_ptr, Tensor tok, Tensor(d!) picked, float temperature) -> ()");
  m.def("head_grad(Tensor logits, int v0, Tensor logz_t, Tensor g_pos, Tensor g_ent, Tensor mean_t, bool with_ent, "
        "Tensor row_ptr, Tensor tok, Tensor val, Tensor(a!) out, float temperature) -> ()");
  m.def("write_decode(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k_new, Tensor v_new, Tensor pos) -> ()");
}
TORCH_LIBRARY_IMPL(hybridrl_cpu, CPU, m) {
  m.impl("decode_attention", hybridrl::decode_attention);
  m.impl("rms_norm", hybridrl::rms_norm);
  m.impl("write_decode", hybridrl::write_decode);
  m.impl("sample_rows", hybridrl::sample_rows);
  m.impl("token_logprobs", hybridrl::token_logprobs);
  m.impl("rotary", hybridrl::rotary);
  m.impl("silu_mul", hybridrl::silu_mul);
  m.impl("pack_linear", hybridrl::pack_linear);
  m.impl("pack_linear_into", hybridrl::pack_linear_into);
  m.impl("load_linear_rows", hybridrl::load_linear_rows);
  m.impl("unpack_linear", hybridrl::unpack_linear);
  m.impl("linear_packed", hybridrl::linear_packed);
  m.impl("train_attention_fwd", hybridrl::train_attention_fwd);
  m.impl("train_attention_bwd", hybridrl::train_attention_bwd);
  m.impl("head_fold", hybridrl::head_fold);
  m.impl("head_grad", hybridrl::head_grad);
}
