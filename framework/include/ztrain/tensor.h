// Shapes and non-owning tensor views.
//
// A TensorView is a pointer, an element type and a row-major shape; it never
// owns memory. Whoever hands one out (a strategy, an arena) says how long it
// stays valid. Copying a view copies the pointer, not the data.
//
// Thread safety: views are values; concurrent writes through two views of the
// same memory are the caller's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "ztrain/dtype.h"
#include "ztrain/error.h"

namespace ztrain {

class ZTRAIN_API Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) {}

  std::size_t rank() const { return dims_.size(); }
  std::int64_t operator[](std::size_t i) const { return dims_.at(i); }
  const std::vector<std::int64_t>& dims() const { return dims_; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : dims_) n *= d;
    return n;
  }
  bool operator==(const Shape&) const = default;
  // "(768, 2304)"
  std::string str() const;

 private:
  std::vector<std::int64_t> dims_;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;

  std::int64_t numel() const { return shape.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }

  // Typed access; raises InternalError when the view holds another type.
  float* f32() const {
    if (dtype != DType::f32)
      throw InternalError("tensor view holds " + std::string(dtype_name(dtype)) +
                          " but was read as f32");
    return static_cast<float*>(data);
  }
};

// Typed pointers: what kernels and copies take. A read-only operand; null
// data means "absent" where an op allows it (no bias, no learned
// positions). Converts from float* so fp32 callers pass plain pointers.
struct ConstTypedPtr {
  const void* data = nullptr;
  DType dtype = DType::f32;
  ConstTypedPtr() = default;
  ConstTypedPtr(std::nullptr_t) {}
  ConstTypedPtr(const float* p) : data(p) {}
  ConstTypedPtr(const void* p, DType t) : data(p), dtype(t) {}
  ConstTypedPtr(const TensorView& v) : data(v.data), dtype(v.dtype) {}
  explicit operator bool() const { return data != nullptr; }
  // The operand starting i elements further on.
  ConstTypedPtr at(std::size_t i) const {
    return {static_cast<const char*>(data) + i * dtype_size(dtype), dtype};
  }
};

// A gradient operand the op adds into (or, for adamw, a working copy it
// overwrites); null data means "not wanted".
struct TypedPtr {
  void* data = nullptr;
  DType dtype = DType::f32;
  TypedPtr() = default;
  TypedPtr(std::nullptr_t) {}
  TypedPtr(float* p) : data(p) {}
  TypedPtr(void* p, DType t) : data(p), dtype(t) {}
  TypedPtr(const TensorView& v) : data(v.data), dtype(v.dtype) {}
  explicit operator bool() const { return data != nullptr; }
  operator ConstTypedPtr() const { return {data, dtype}; }
  TypedPtr at(std::size_t i) const {
    return {static_cast<char*>(data) + i * dtype_size(dtype), dtype};
  }
};

}  // namespace ztrain
