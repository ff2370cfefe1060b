// Every op of Kernels (all return void) as X(name, (parameters),
// (arguments)), for the decorators that wrap each op the same way (bench's
// TimedKernels, the guarded device's kernels): one list, so a new op
// reaches every one.
#pragma once

// clang-format off
#define ZTRAIN_KERNEL_OPS(X) \
  X(embedding_forward, (float* a, const std::int32_t* b, ConstTypedPtr c, ConstTypedPtr d, int e, int f, int g), (a, b, c, d, e, f, g)) \
  X(embedding_backward, (TypedPtr a, TypedPtr b, const float* c, const std::int32_t* d, int e, int f, int g), (a, b, c, d, e, f, g)) \
  X(layernorm_forward, (float* a, float* b, float* c, const float* d, ConstTypedPtr e, ConstTypedPtr f, int g, int h, float i), (a, b, c, d, e, f, g, h, i)) \
  X(layernorm_backward, (float* a, TypedPtr b, TypedPtr c, const float* d, const float* e, ConstTypedPtr f, const float* g, const float* h, int i, int j), (a, b, c, d, e, f, g, h, i, j)) \
  X(add_layernorm_forward, (float* a, float* b, float* c, float* d, const float* e, const float* f, ConstTypedPtr g, ConstTypedPtr h, int i, int j, float k), (a, b, c, d, e, f, g, h, i, j, k)) \
  X(rmsnorm_forward, (float* a, float* b, const float* c, ConstTypedPtr d, int e, int f, float g), (a, b, c, d, e, f, g)) \
  X(rmsnorm_backward, (float* a, TypedPtr b, const float* c, const float* d, ConstTypedPtr e, const float* f, int g, int h), (a, b, c, d, e, f, g, h)) \
  X(add_rmsnorm_forward, (float* a, float* b, float* c, const float* d, const float* e, ConstTypedPtr f, int g, int h, float i), (a, b, c, d, e, f, g, h, i)) \
  X(matmul_forward, (float* a, const float* b, ConstTypedPtr c, ConstTypedPtr d, int e, int f, int g), (a, b, c, d, e, f, g)) \
  X(matmul_backward, (float* a, TypedPtr b, TypedPtr c, const float* d, const float* e, ConstTypedPtr f, int g, int h, int i), (a, b, c, d, e, f, g, h, i)) \
  X(gelu_forward, (float* a, const float* b, ConstTypedPtr c, int d, int e), (a, b, c, d, e)) \
  X(gelu_backward, (float* a, TypedPtr b, const float* c, ConstTypedPtr d, const float* e, int f, int g), (a, b, c, d, e, f, g)) \
  X(swiglu_forward, (float* a, const float* b, const float* c, std::size_t d), (a, b, c, d)) \
  X(swiglu_backward, (float* a, float* b, const float* c, const float* d, const float* e, std::size_t f), (a, b, c, d, e, f)) \
  X(rope_forward, (float* a, const float* b, const float* c, int d, int e, int f, int g, int h), (a, b, c, d, e, f, g, h)) \
  X(rope_backward, (float* a, const float* b, const float* c, int d, int e, int f, int g, int h), (a, b, c, d, e, f, g, h)) \
  X(attention_forward, (float* a, float* b, const float* c, const float* d, const float* e, int f, int g, int h, int i, int j, int k, int l), (a, b, c, d, e, f, g, h, i, j, k, l)) \
  X(attention_backward, (float* a, float* b, float* c, const float* d, const float* e, const float* f, const float* g, const float* h, const float* i, int j, int k, int l, int m, int n, int o, int p), (a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p)) \
  X(add, (float* a, const float* b, const float* c, std::size_t d), (a, b, c, d)) \
  X(softmax_crossentropy_forward, (float* a, float* b, const std::int32_t* c, int d, int e), (a, b, c, d, e)) \
  X(softmax_crossentropy_backward, (float* a, const std::int32_t* b, float c, int d, int e), (a, b, c, d, e)) \
  X(sum_squares_add, (StepScalars* a, ConstTypedPtr b, std::size_t c), (a, b, c)) \
  X(grad_norm_unscale, (StepScalars* a, double b), (a, b)) \
  X(grad_norm_finish, (StepScalars* a, bool b, double c, double d), (a, b, c, d)) \
  X(adamw, (float* a, TypedPtr b, float* c, float* d, TypedPtr e, const AdamWRun* f, std::size_t g, const AdamWHyper& h, const StepScalars* i, GradAfter j), (a, b, c, d, e, f, g, h, i, j)) \
  X(mean_add, (double* a, const float* b, std::size_t c), (a, b, c))
// clang-format on
