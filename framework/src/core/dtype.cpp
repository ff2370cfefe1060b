#include "ztrain/dtype.h"

#include <algorithm>
#include <cstring>

#include "ztrain/error.h"

namespace ztrain {

void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n) {
  if (n == 0) return;  // empty buffers may be null
  if (src_type == dst_type) {
    std::memmove(dst, src, n * dtype_size(src_type));
    return;
  }
  const auto* s16 = static_cast<const std::uint16_t*>(src);
  const auto* s32 = static_cast<const float*>(src);
  auto* d16 = static_cast<std::uint16_t*>(dst);
  auto* d32 = static_cast<float*>(dst);
  auto load = [&](std::size_t i) -> float {
    switch (src_type) {
      case DType::f32:
        return s32[i];
      case DType::bf16:
        return bf16_to_float(s16[i]);
      case DType::f16:
        return f16_to_float(s16[i]);
    }
    throw InternalError("convert: unknown source dtype");
  };
  for (std::size_t i = 0; i < n; ++i) {
    const float f = load(i);
    switch (dst_type) {
      case DType::f32:
        d32[i] = f;
        break;
      case DType::bf16:
        d16[i] = float_to_bf16(f);
        break;
      case DType::f16:
        d16[i] = float_to_f16(f);
        break;
    }
  }
}

void add_into(void* dst, const void* src, std::size_t n, DType type) {
  if (type == DType::f32) {
    auto* d = static_cast<float*>(dst);
    const auto* s = static_cast<const float*>(src);
    for (std::size_t i = 0; i < n; ++i) d[i] += s[i];
    return;
  }
  auto* d = static_cast<std::uint16_t*>(dst);
  const auto* s = static_cast<const std::uint16_t*>(src);
  for (std::size_t i = 0; i < n; ++i)
    d[i] = type == DType::bf16 ? float_to_bf16(bf16_to_float(d[i]) + bf16_to_float(s[i]))
                               : float_to_f16(f16_to_float(d[i]) + f16_to_float(s[i]));
}

void max_into(void* dst, const void* src, std::size_t n, DType type) {
  if (type == DType::f32) {
    auto* d = static_cast<float*>(dst);
    const auto* s = static_cast<const float*>(src);
    for (std::size_t i = 0; i < n; ++i) d[i] = std::max(d[i], s[i]);
    return;
  }
  auto* d = static_cast<std::uint16_t*>(dst);
  const auto* s = static_cast<const std::uint16_t*>(src);
  const auto widen = type == DType::bf16 ? bf16_to_float : f16_to_float;
  for (std::size_t i = 0; i < n; ++i)
    if (widen(s[i]) > widen(d[i])) d[i] = s[i];
}

}  // namespace ztrain
