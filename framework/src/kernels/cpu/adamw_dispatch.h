// Picks the AdamW loop instance for a call's operand types.
//
// The vectorised AdamW loops (vector_math.cpp's AVX2, adamw_avx512.cpp's
// AVX-512) are templates over the gradient's type G, the working copy's
// type W and whether a working copy is written at all; adamw_typed maps the
// runtime types of a call to the instance, the same way for every
// instruction set.
//
// Thread safety: a pure function of its arguments.
#pragma once

#include "ztrain/kernels.h"

namespace ztrain::vec {

// Loop: a class with
//   template <DType G, DType W, bool kWork>
//   static void run(float* p, void* g, float* m, float* v, void* working, Args...);
template <class Loop, class... Args>
void adamw_typed(float* p, TypedPtr g, float* m, float* v, TypedPtr working, Args... args) {
  const auto with_grad = [&]<DType G>() {
    if (!working)
      return Loop::template run<G, DType::f32, false>(p, g.data, m, v, nullptr, args...);
    switch (working.dtype) {
      case DType::f32:
        return Loop::template run<G, DType::f32, true>(p, g.data, m, v, working.data, args...);
      case DType::bf16:
        return Loop::template run<G, DType::bf16, true>(p, g.data, m, v, working.data, args...);
      case DType::f16:
        return Loop::template run<G, DType::f16, true>(p, g.data, m, v, working.data, args...);
    }
  };
  switch (g.dtype) {
    case DType::f32:
      return with_grad.template operator()<DType::f32>();
    case DType::bf16:
      return with_grad.template operator()<DType::bf16>();
    case DType::f16:
      return with_grad.template operator()<DType::f16>();
  }
}

}  // namespace ztrain::vec
