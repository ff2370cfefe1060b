// dtype conversions against independent references: the processor's own
// F16C conversion for f16 (every float class), exhaustive round trips, and a
// brute-force nearest-even search for bf16.
#include <doctest/doctest.h>
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "ztrain/device.h"
#include "ztrain/dtype.h"

using namespace ztrain;

namespace {

// Reference bf16 rounding by search: the two neighbours, ties to even.
std::uint16_t bf16_reference(float f) {
  if (std::isnan(f)) return 0;  // caller skips NaN
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t lo = static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t hi = static_cast<std::uint16_t>(lo + 1);
  // The neighbour past the largest finite bf16 is infinity; rounding treats
  // it as 2^128, the next power of two, so that values past the midpoint go
  // to infinity as IEEE specifies.
  auto value = [](std::uint16_t h) {
    const float v = bf16_to_float(h);
    return std::isinf(v) ? std::copysign(std::ldexp(1.0, 128), static_cast<double>(v))
                         : static_cast<double>(v);
  };
  const double dl = std::fabs(value(lo) - f);
  const double dh = std::fabs(value(hi) - f);
  if ((u & 0xffffu) == 0) return lo;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1u) ? hi : lo;
}

}  // namespace

TEST_CASE("f16 round trip is exact for every non-NaN half") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      CHECK(std::isnan(f16_to_float(float_to_f16(f))));
      continue;
    }
    CHECK(float_to_f16(f) == h);
  }
}

TEST_CASE("f16 conversion agrees with the processor's F16C on edge cases and random floats") {
#if defined(__F16C__)
  std::vector<float> values{0.0f,
                            -0.0f,
                            1.0f,
                            65504.0f,
                            65519.99f,
                            65520.0f,
                            1e10f,
                            -1e10f,
                            INFINITY,
                            -INFINITY,
                            6.1e-5f,
                            5.96e-8f,
                            2.98e-8f,
                            2.99e-8f,
                            1e-9f,
                            3.0e-5f,
                            1.0f + 1.0f / 2048,
                            1.0f + 3.0f / 2048};
  std::mt19937 rng(1);
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t bits = rng();
    // Concentrate on the exponent range f16 can represent (and a bit beyond).
    bits = (bits & 0x807fffffu) | ((100u + (bits >> 23) % 60u) << 23);
    values.push_back(std::bit_cast<float>(bits));
  }
  for (float f : values) {
    const std::uint16_t hw = static_cast<std::uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
    INFO("value " << f);
    CHECK(float_to_f16(f) == hw);
    CHECK(std::bit_cast<std::uint32_t>(f16_to_float(hw)) ==
          std::bit_cast<std::uint32_t>(_cvtsh_ss(hw)));
  }
#else
  MESSAGE("no F16C on this compiler target; exhaustive round trip still checks f16");
#endif
}

TEST_CASE("bf16 rounds to nearest even, keeps NaN and infinities") {
  std::mt19937 rng(2);
  for (int i = 0; i < 500000; ++i) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    if (std::isnan(f)) {
      CHECK(std::isnan(bf16_to_float(float_to_bf16(f))));
      continue;
    }
    CHECK(float_to_bf16(f) == bf16_reference(f));
  }
  CHECK(float_to_bf16(1.0f + 1.0f / 256) == float_to_bf16(1.0f));  // tie to even (down)
  CHECK(float_to_bf16(1.0f + 3.0f / 256) == float_to_bf16(1.0f + 4.0f / 256));  // tie to even (up)
  CHECK(std::isinf(bf16_to_float(float_to_bf16(INFINITY))));
  CHECK(std::isinf(bf16_to_float(float_to_bf16(3.4e38f))));  // rounds past the largest bf16
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_float(static_cast<std::uint16_t>(h));
    if (!std::isnan(f)) CHECK(float_to_bf16(f) == h);
  }
}

TEST_CASE("convert between all dtypes") {
  const std::vector<float> src{0.5f, -2.25f, 1e-3f, 300.0f};
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<std::uint16_t> mid(src.size());
    std::vector<float> back(src.size());
    convert(src.data(), DType::f32, mid.data(), t, src.size());
    convert(mid.data(), t, back.data(), DType::f32, src.size());
    for (std::size_t i = 0; i < src.size(); ++i)
      CHECK(back[i] == doctest::Approx(src[i]).epsilon(1e-2));
  }
  std::vector<std::uint16_t> h(1), b(1);
  const float one = 1.0f;
  convert(&one, DType::f32, h.data(), DType::f16, 1);
  convert(h.data(), DType::f16, b.data(), DType::bf16, 1);
  CHECK(b[0] == float_to_bf16(1.0f));
  CHECK(dtype_size(DType::f32) == 4);
  CHECK(dtype_name(DType::bf16) == "bf16");
}

// The cpu device converts in parallel blocks with the vector loops; every
// element must be what the scalar conversion gives, across the blocks'
// seams, for ties, subnormals, overflow, infinities and NaN, and the same
// at 1 and 2 threads.
TEST_CASE("the cpu device converts as dtype.h does, element by element, at any thread count") {
  const std::size_t n = (std::size_t{1} << 17) + 77;
  std::vector<float> src(n);
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (float& f : src) f = std::bit_cast<float>(bits(rng));
  const float specials[] = {0.0f,   -0.0f, 1.0f + 0x1p-8f, 1.0f + 0x1p-11f, 65520.0f,
                            1e-45f, 1e30f, INFINITY,       -INFINITY,       NAN};
  for (std::size_t i = 0; i < std::size(specials); ++i) src[65535 + i] = specials[i];
  for (int threads : {1, 2}) {
    auto device = make_cpu_device(threads);
    for (DType t : {DType::bf16, DType::f16}) {
      CAPTURE(dtype_name(t));
      std::vector<std::uint16_t> want(n), got(n);
      convert(src.data(), DType::f32, want.data(), t, n);
      device->convert({got.data(), t}, src.data(), n);
      CHECK(got == want);
      std::vector<float> back_want(n), back_got(n);
      convert(want.data(), t, back_want.data(), DType::f32, n);
      device->convert(back_got.data(), {want.data(), t}, n);
      CHECK(std::memcmp(back_got.data(), back_want.data(), n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("add_into sums in fp32 and rounds once, f16 overflowing to infinity") {
  const std::vector<float> a{1.0f, 0.1f, -3.5f, 60000.0f, 1e-3f},
      b{2.0f, 0.2f, 1.25f, 60000.0f, 3e-3f};
  std::vector<float> f = a;
  add_into(f.data(), b.data(), a.size(), DType::f32);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(f[i] == a[i] + b[i]);
  for (DType t : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(t));
    std::vector<std::uint16_t> x(a.size()), y(a.size()), want(a.size());
    convert(a.data(), DType::f32, x.data(), t, a.size());
    convert(b.data(), DType::f32, y.data(), t, b.size());
    std::vector<float> xf(a.size()), yf(a.size());
    convert(x.data(), t, xf.data(), DType::f32, a.size());
    convert(y.data(), t, yf.data(), DType::f32, a.size());
    for (std::size_t i = 0; i < a.size(); ++i) xf[i] += yf[i];
    convert(xf.data(), DType::f32, want.data(), t, a.size());
    add_into(x.data(), y.data(), a.size(), t);
    CHECK(x == want);
  }
  std::uint16_t h = float_to_f16(60000.0f);
  const std::uint16_t g = h;
  add_into(&h, &g, 1, DType::f16);
  CHECK(std::isinf(f16_to_float(h)));
}
