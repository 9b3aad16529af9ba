// 32-byte vectors of float / double with a vector exp and log: GCC vector extensions, AVX registers
// in the AVX+FMA copy of a kernel file, pairs of SSE registers in the baseline copy (csrc/cpu/isa.h).
// Included by the kernel files (kde_kernels.h, quantize_kernels.h) into each instruction-set namespace:
// no include guard on purpose, and no includes (the entry point's file includes <cstdint> etc.).

// Bit layout of A for the vector log.
template <typename A>
struct FloatBits;
template <>
struct FloatBits<float> {
  using I = int32_t;
  static constexpr int kShift = 23, kTerms = 6;  // atanh series to s^11
  static constexpr I kMant = 0x007fffff, kOne = 0x3f800000, kExp = 0xff, kBias = 127;
  static constexpr float kMinNormal = 1.17549435e-38f;
  static constexpr float kExpMin = -87.0f, kMagic = 12582912.0f;  // 1.5 * 2^23
  static constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187045e-06f;
  static constexpr int kTaylor = 7;  // exp: truncation < 6e-9 on |r| <= ln2 / 2
};
template <>
struct FloatBits<double> {
  using I = int64_t;
  static constexpr int kShift = 52, kTerms = 11;  // atanh series to s^21
  static constexpr I kMant = 0x000fffffffffffffLL, kOne = 0x3ff0000000000000LL;
  static constexpr I kExp = 0x7ff, kBias = 1023;
  static constexpr double kMinNormal = 2.2250738585072014e-308;
  static constexpr double kExpMin = -708.0, kMagic = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  static constexpr int kTaylor = 12;  // exp: truncation < 2e-16 on |r| <= ln2 / 2
};

// 32-byte vectors of A (8 floats / 4 doubles): GCC vector extensions, AVX registers in the
// AVX+FMA copy, pairs of SSE registers in the baseline copy.
template <typename A>
struct Simd {
  using B = FloatBits<A>;
  static constexpr int L = 32 / sizeof(A);
  typedef A V __attribute__((vector_size(32)));
  typedef typename B::I VI __attribute__((vector_size(32)));
  static V load(const A* p) {
    V v;
    __builtin_memcpy(&v, p, sizeof(V));
    return v;
  }
  static void store(A* p, V v) { __builtin_memcpy(p, &v, sizeof(V)); }
  static A sum(V v) {
    A s = 0;
    for (int l = 0; l < L; ++l) s += v[l];
    return s;
  }
  static V abs(V v) { return v < A(0) ? -v : v; }
  // Natural log of normal x > 0: x = 2^e m, m in [sqrt(1/2), sqrt(2)), log x = e ln2 +
  // 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716, odd series (fp32 to s^11: truncation
  // < 3e-10 relative; fp64 to s^21: < 1e-18). Lanes outside that domain are garbage.
  // Comparisons are on floats and the exponent is taken with bitwise AND / OR and a conversion: AVX (without
  // AVX2) has no 256-bit integer compares or shifts, which GCC would emulate lane by lane.
  static V log(V x) {
    const VI bits = (VI)x;
    V m = (V)((bits & B::kMant) | B::kOne);  // the mantissa, in [1, 2)
    V e;  // the exponent, exactly
    if constexpr (sizeof(A) == 4) {
      e = __builtin_convertvector(bits & (B::kExp << B::kShift), V) * A(1.0 / (1 << B::kShift)) - A(B::kBias);
    } else {  // no int64 -> double conversion in AVX: the exponent field below 2^52, or'ed into 2^52
      const A two52 = A(typename B::I(1) << B::kShift);
      e = (V)((bits >> B::kShift) | (VI)(V{} + two52)) - two52 - A(B::kBias);
    }
    const VI big = m > A(1.4142135623730951);  // -1 where m > sqrt(2): use m / 2, e + 1
    m = big ? m * A(0.5) : m;
    e = big ? e + A(1) : e;
    const V s = (m - A(1)) / (m + A(1)), s2 = s * s;
    V p = V{} + A(1) / A(2 * B::kTerms - 1);
    for (int k = B::kTerms - 2; k >= 0; --k) p = p * s2 + A(1) / A(2 * k + 1);
    return e * A(0.6931471805599453) + A(2) * s * p;
  }
  // exp(x) for x <= 0, the vector twin of vexp (kde.h): x clamped at -87 (fp32) / -708 (fp64),
  // round by a magic constant, Cody-Waite reduction, Taylor polynomial, 2^n from a float -> int
  // conversion of (n + bias) 2^shift (AVX has no 256-bit integer shifts).
  static V exp(V x) {
    x = x > B::kExpMin ? x : V{} + A(B::kExpMin);
    const V t = x * A(1.4426950408889634074) + B::kMagic;
    const V n = t - B::kMagic;
    const V r = (x - n * B::kLn2Hi) - n * B::kLn2Lo;
    A fact = 1;
    for (int k = 2; k <= B::kTaylor; ++k) fact *= A(k);
    V p = V{} + A(1) / fact;
    for (int k = B::kTaylor - 1; k >= 0; --k) {
      fact /= A(k + 1);
      p = p * r + A(1) / fact;
    }
    const VI sc = __builtin_convertvector((n + A(B::kBias)) * A(typename B::I(1) << B::kShift), VI);
    return p * (V)sc;
  }
  // p log p and its derivative log p + 1, both 0 below the normal range (|p log p| < 1e-36
  // there; the reference's convention at p = 0).
  static V xlogx(V p) {
    const VI pos = p >= B::kMinNormal;
    return pos ? p * log(pos ? p : V{} + A(1)) : V{};
  }
  static V dxlogx(V p) {
    const VI pos = p >= B::kMinNormal;
    return pos ? log(pos ? p : V{} + A(1)) + A(1) : V{};
  }
};
