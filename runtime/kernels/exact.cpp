// The engine's exact kernels: its matrix products and its exponential, whose bits
// depend on their inputs alone (not on row counts, threads or the instruction set).
//
// ---- gemm ----------------------------------------------------------------
//
//   C[b, m, n] = sum over k = 0 .. K-1 of A[b, m, k] * B[b, k, n]
//
// Safety invariant (exactness): every element of C is ONE sequential chain of
// fused multiply-adds, acc = fma(A[m, k], B[k, n], acc) for k = 0, 1, ..., K-1,
// starting from acc = +0. Nothing else touches it: no split of K, no partial sums,
// no reduction tree. The chain reads only row m of A and column n of B, so an
// element's bits depend on those K pairs and on nothing else: not on how many
// rows share the call, where the row sits among them, how the rows are blocked
// into micro-tiles, which thread computes it, nor on the instruction set. A
// vector FMA computes each lane as the correctly rounded a * b + c, exactly what
// the scalar std::fma computes, so the AVX2 kernel and the portable kernel (the
// one aarch64 and FMA-less x86 run) give the same bits; tests/unit/engine/test_ops.py
// compares them. Build without -ffast-math and with -ffp-contract=off so the
// compiler adds or reorders nothing.
//
// Layout. A: row-major with row stride lda (columns contiguous), batch stride
// a_bs. B is read in panels of NR = 16 columns: element (k, n) lives at
//     B[(n / NR) * b_ps + k * ldb + n % NR]
// which covers a plain row-major [K, N] matrix (b_ps = NR, ldb = row stride) and
// a pre-packed weight [N / NR][K][NR] (b_ps = K * NR, ldb = NR; see ops.Linear).
// A partial last panel is read with masked loads, so nothing past N is touched.
// C: row-major with row stride ldc, batch stride c_bs.
//
// Work is split into units (batch entry, panel) handed to threads in fixed
// contiguous ranges; a unit walks row blocks (about 256 KiB of A) and micro-tiles of
// MR x NR. None of this changes a chain.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <initializer_list>
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PD_X86 1
#endif

namespace {

constexpr int NR = 16;   // columns per panel: two 8-float AVX2 vectors
constexpr int MR = 6;    // rows per micro-tile: 12 accumulators + 2 B vectors + 1 A broadcast
constexpr long A_BLOCK_FLOATS = 64 * 1024;  // rows per block: about 256 KiB of A stays in L2

enum Isa : int { ISA_AUTO = 0, ISA_PORTABLE = 1, ISA_AVX2 = 2 };

struct Gemm {
  const float* a; long a_bs, lda;
  const float* b; long b_bs, ldb, b_ps;
  float* c; long c_bs, ldc;
  long batch, m, n, k;
};

using Micro = void (*)(long k, const float* a, long lda, const float* b, long ldb,
                       float* c, long ldc, int nr);

// ---- portable kernel: std::fma per element, the definition of the result ----
template <int R>
void micro_portable(long k, const float* a, long lda, const float* b, long ldb,
                    float* c, long ldc, int nr) {
  float acc[R][NR] = {};
  for (long p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    for (int i = 0; i < R; ++i) {
      const float ai = a[i * lda + p];
      for (int j = 0; j < nr; ++j) acc[i][j] = std::fma(ai, bp[j], acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < nr; ++j) c[i * ldc + j] = acc[i][j];
}

#ifdef PD_X86
// ---- AVX2 + FMA: the same chains, 16 columns at a time ----
__attribute__((target("avx2,fma"))) inline __m256i lane_mask(int valid) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), idx);
}

// The accumulators are named registers, not an array: GCC keeps an array of vectors
// in memory and stores it back on every step, which halves the speed.
#define PD_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

// FULL: all 16 columns valid (plain loads). Otherwise masked loads and stores;
// TWO: whether columns 8..15 hold any valid column (a panel of at most 8 valid
// columns — head_dim 8, a softmax sum column — runs half the FMAs).
template <int R, bool FULL, bool TWO>
__attribute__((target("avx2,fma"))) void micro_avx2_body(long k, const float* a, long lda,
                                                         const float* b, long ldb, float* c,
                                                         long ldc, int nr) {
  static_assert(R >= 1 && R <= MR, "row count");
  static_assert(TWO || !FULL, "a full panel has 16 columns");
#define PD_DECL(i)                                         \
  __m256 acc##i##_0 = _mm256_setzero_ps(), acc##i##_1 = acc##i##_0; \
  const float* a##i = a + (R > i ? i : 0) * lda;
  PD_ROWS(PD_DECL)
#undef PD_DECL
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  if (!FULL) {
    m0 = lane_mask(std::min(nr, 8));
    m1 = lane_mask(std::max(nr - 8, 0));
  }
#pragma GCC unroll 4
  for (long p = 0; p < k; ++p, b += ldb) {
    __m256 b0, b1 = _mm256_setzero_ps();
    if (FULL) {
      b0 = _mm256_loadu_ps(b);
      b1 = _mm256_loadu_ps(b + 8);
    } else {
      b0 = _mm256_maskload_ps(b, m0);
      if (TWO) b1 = _mm256_maskload_ps(b + 8, m1);
    }
#define PD_STEP(i)                                                \
    if constexpr (R > i) {                                        \
      const __m256 ai = _mm256_broadcast_ss(a##i + p);            \
      acc##i##_0 = _mm256_fmadd_ps(ai, b0, acc##i##_0);           \
      if constexpr (TWO) acc##i##_1 = _mm256_fmadd_ps(ai, b1, acc##i##_1); \
    }
    PD_ROWS(PD_STEP)
#undef PD_STEP
  }
#define PD_STORE(i)                                                  \
  if constexpr (R > i) {                                             \
    if (FULL) {                                                      \
      _mm256_storeu_ps(c + i * ldc, acc##i##_0);                     \
      _mm256_storeu_ps(c + i * ldc + 8, acc##i##_1);                 \
    } else {                                                         \
      _mm256_maskstore_ps(c + i * ldc, m0, acc##i##_0);              \
      if (TWO) _mm256_maskstore_ps(c + i * ldc + 8, m1, acc##i##_1); \
    }                                                                \
  }
  PD_ROWS(PD_STORE)
#undef PD_STORE
}
#undef PD_ROWS

template <int R>
__attribute__((target("avx2,fma"))) void micro_avx2(long k, const float* a, long lda,
                                                    const float* b, long ldb, float* c,
                                                    long ldc, int nr) {
  if (nr == NR)
    micro_avx2_body<R, true, true>(k, a, lda, b, ldb, c, ldc, nr);
  else if (nr > 8)
    micro_avx2_body<R, false, true>(k, a, lda, b, ldb, c, ldc, nr);
  else
    micro_avx2_body<R, false, false>(k, a, lda, b, ldb, c, ldc, nr);
}

bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
bool has_avx2() { return false; }
#endif

// Micro-kernels by row count (index r = rows in the tile, 1..MR).
const Micro PORTABLE[MR + 1] = {nullptr, micro_portable<1>, micro_portable<2>, micro_portable<3>,
                                micro_portable<4>, micro_portable<5>, micro_portable<6>};
#ifdef PD_X86
const Micro AVX2[MR + 1] = {nullptr, micro_avx2<1>, micro_avx2<2>, micro_avx2<3>,
                            micro_avx2<4>, micro_avx2<5>, micro_avx2<6>};
#endif

const Micro* kernels_for(int isa) {
#ifdef PD_X86
  if (isa == ISA_AVX2 || (isa == ISA_AUTO && has_avx2())) return AVX2;
#endif
  return PORTABLE;
}

// Runs body(begin, end) over [0, n) split into nt contiguous ranges, one per thread.
// Where the splits fall never changes a result: each element is computed whole by
// one thread, the same way on every thread.
template <class Body>
void split_range(long n, long nt, Body body) {
  if (nt <= 1) {
    body(0L, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
#ifdef _OPENMP
    const long t = omp_get_thread_num(), n_t = omp_get_num_threads();
#else
    const long t = 0, n_t = 1;
#endif
    body(n * t / n_t, n * (t + 1) / n_t);
  }
}

// Units [u0, u1) of the (batch entry, panel) grid, in order.
void run_units(const Gemm& g, const Micro* micro, long u0, long u1) {
  const long panels = (g.n + NR - 1) / NR;
  const long mc = std::max<long>(MR, A_BLOCK_FLOATS / std::max<long>(g.k, 1) / MR * MR);
  while (u0 < u1) {
    const long bi = u0 / panels, p0 = u0 % panels;
    const long p1 = std::min(panels, p0 + (u1 - u0));
    const float* a = g.a + bi * g.a_bs;
    const float* b = g.b + bi * g.b_bs;
    float* c = g.c + bi * g.c_bs;
    for (long m0 = 0; m0 < g.m; m0 += mc) {
      const long m1 = std::min(g.m, m0 + mc);
      for (long p = p0; p < p1; ++p) {
        const int nr = static_cast<int>(std::min<long>(NR, g.n - p * NR));
        const float* bp = b + p * g.b_ps;
        for (long i = m0; i < m1; i += MR) {
          const int r = static_cast<int>(std::min<long>(MR, m1 - i));
          micro[r](g.k, a + i * g.lda, g.lda, bp, g.ldb, c + i * g.ldc + p * NR, g.ldc, nr);
        }
      }
    }
    u0 += p1 - p0;
  }
}

// Below this many multiply-adds a call runs on the calling thread (forking costs more).
constexpr double SERIAL_MACS = 1 << 16;

void gemm(const Gemm& g, int threads, int isa) {
  const Micro* micro = kernels_for(isa);
  const long units = g.batch * ((g.n + NR - 1) / NR);
  if (units == 0 || g.m == 0) return;
  if (g.k == 0) {  // an empty sum is +0
    for (long bi = 0; bi < g.batch; ++bi)
      for (long i = 0; i < g.m; ++i)
        std::fill_n(g.c + bi * g.c_bs + i * g.ldc, g.n, 0.0f);
    return;
  }
  const double macs = static_cast<double>(g.batch) * g.m * g.n * g.k;
  long nt = std::min<long>(std::max(threads, 1), units);
  if (macs < SERIAL_MACS) nt = 1;
  split_range(units, nt, [&](long u0, long u1) { run_units(g, micro, u0, u1); });
}


// ---- exp -----------------------------------------------------------------
//
// y = exp(x) elementwise. torch's exp is not position-invariant: its vector body
// (SLEEF) and its scalar tail (libm) round differently, and which elements fall in
// the tail depends on the tensor's size and on where threads split it. Here every
// element takes the same sequence of correctly rounded operations on every path:
//   n = floor(fma(x, log2 e, 1/2));  r = fma(n, -ln2_hi, x);  r = fma(n, -ln2_lo, r)
//   p = Horner of the degree-5 polynomial in r by fma;  y = fma(p, r*r, r) + 1
//   y = y * 2^n (exact)
// (Cephes' expf coefficients: about 1 ulp.) Outside [X_LO, X_HI] the result is
// 0 (exactly: masked attention slots, x = -inf, must weigh nothing) or +inf; NaN
// stays NaN.

constexpr float LOG2E = 1.44269504088896341f;
constexpr float LN2_HI = 0.693359375f;
constexpr float LN2_LO = -2.12194440e-4f;
constexpr float X_LO = -87.0f;  // 2^n stays a normal number above this
constexpr float X_HI = 88.0f;   // n <= 127 below this
constexpr float P0 = 1.9875691500e-4f, P1 = 1.3981999507e-3f, P2 = 8.3334519073e-3f,
                P3 = 4.1665795894e-2f, P4 = 1.6666665459e-1f, P5 = 5.0000001201e-1f;

inline float exp_portable(float x) {
  if (std::isnan(x)) return x;
  if (x < X_LO) return 0.0f;
  if (x > X_HI) return INFINITY;
  const float n = std::floor(std::fma(x, LOG2E, 0.5f));
  float r = std::fma(n, -LN2_HI, x);
  r = std::fma(n, -LN2_LO, r);
  float p = std::fma(P0, r, P1);
  p = std::fma(p, r, P2);
  p = std::fma(p, r, P3);
  p = std::fma(p, r, P4);
  p = std::fma(p, r, P5);
  const float y = std::fma(p, r * r, r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

void exp_range_portable(const float* x, float* y, long n) {
  for (long i = 0; i < n; ++i) y[i] = exp_portable(x[i]);
}

#ifdef PD_X86
__attribute__((target("avx2,fma"))) inline __m256 exp8_avx2(__m256 x) {
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(P0), r, _mm256_set1_ps(P1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  // Lanes outside [X_LO, X_HI] compute garbage here and are replaced below.
  const __m256 safe_n = _mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(safe_n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(X_LO), _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(X_HI), _CMP_GT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

__attribute__((target("avx2,fma"))) void exp_range_avx2(const float* x, float* y, long n) {
  long i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8_avx2(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] = exp_portable(x[i]);
}
#endif

// Below this many elements an exp runs on the calling thread.
constexpr long SERIAL_EXPS = 1 << 15;

void exp_elements(const float* x, float* y, long n, int threads, int isa) {
  void (*range)(const float*, float*, long) = exp_range_portable;
#ifdef PD_X86
  if (isa == ISA_AVX2 || (isa == ISA_AUTO && has_avx2())) range = exp_range_avx2;
#endif
  const long nt = n < SERIAL_EXPS ? 1 : std::max(threads, 1);
  split_range(n, nt, [&](long i0, long i1) { range(x + i0, y + i0, i1 - i0); });
}


// ---- silu_mul --------------------------------------------------------------
//
// SwiGLU's activation: out[t, i] = silu(g) * u with g = gu[t, i], u = gu[t, I + i],
// silu(g) = g / (1 + exp(-g)) by the exp above; the division and products are
// correctly rounded, so every path gives the same bits.

inline float silu_mul_portable(float g, float u) { return g / (1.0f + exp_portable(-g)) * u; }

void silu_mul_rows_portable(const float* gu, float* out, long rows, long inner, long gu_ld, long out_ld) {
  for (long t = 0; t < rows; ++t)
    for (long i = 0; i < inner; ++i)
      out[t * out_ld + i] = silu_mul_portable(gu[t * gu_ld + i], gu[t * gu_ld + inner + i]);
}

#ifdef PD_X86
__attribute__((target("avx2,fma"))) void silu_mul_rows_avx2(const float* gu, float* out, long rows,
                                                            long inner, long gu_ld, long out_ld) {
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  for (long t = 0; t < rows; ++t) {
    const float* g = gu + t * gu_ld;
    const float* u = g + inner;
    float* o = out + t * out_ld;
    long i = 0;
    for (; i + 8 <= inner; i += 8) {
      const __m256 gv = _mm256_loadu_ps(g + i);
      const __m256 e = exp8_avx2(_mm256_xor_ps(gv, sign));
      const __m256 sv = _mm256_div_ps(gv, _mm256_add_ps(one, e));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(sv, _mm256_loadu_ps(u + i)));
    }
    for (; i < inner; ++i) o[i] = silu_mul_portable(g[i], u[i]);
  }
}
#endif

void silu_mul(const float* gu, float* out, long rows, long inner, long gu_ld, long out_ld,
              int threads, int isa) {
  void (*range)(const float*, float*, long, long, long, long) = silu_mul_rows_portable;
#ifdef PD_X86
  if (isa == ISA_AVX2 || (isa == ISA_AUTO && has_avx2())) range = silu_mul_rows_avx2;
#endif
  const long nt = rows * inner < SERIAL_EXPS ? 1 : std::min<long>(std::max(threads, 1), rows);
  split_range(rows, nt, [&](long r0, long r1) {
    range(gu + r0 * gu_ld, out + r0 * out_ld, r1 - r0, inner, gu_ld, out_ld);
  });
}

// ---- Python binding -------------------------------------------------------
// Every function takes integers (tensor addresses from data_ptr(), strides in
// elements, sizes, threads, isa), returns None, and releases the GIL while it runs.

// Reads exactly `want` integer arguments into out; false with a Python error set.
bool parse_longs(const char* name, PyObject* const* args, Py_ssize_t nargs, int want, long* out) {
  if (nargs != want) {
    PyErr_Format(PyExc_TypeError, "%s takes %d integer arguments, got %zd", name, want, nargs);
    return false;
  }
  for (int i = 0; i < want; ++i) {
    out[i] = PyLong_AsLong(args[i]);
    if (out[i] == -1 && PyErr_Occurred()) return false;
  }
  return true;
}

// Sizes must be >= 0 and a forced AVX2 path needs the CPU to have it.
bool check_call(const char* name, std::initializer_list<long> sizes, long isa) {
  for (long size : sizes) {
    if (size < 0) {
      PyErr_Format(PyExc_ValueError, "%s: negative size %ld", name, size);
      return false;
    }
  }
  if (isa == ISA_AVX2 && !has_avx2()) {
    PyErr_Format(PyExc_ValueError, "%s: this CPU has no AVX2+FMA", name);
    return false;
  }
  return true;
}

// gemm(a, a_bs, lda, b, b_bs, ldb, b_ps, c, c_bs, ldc, batch, m, n, k, threads, isa)
PyObject* py_gemm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  long v[16];
  if (!parse_longs("gemm", args, nargs, 16, v) || !check_call("gemm", {v[10], v[11], v[12], v[13]}, v[15]))
    return nullptr;
  const Gemm g{reinterpret_cast<const float*>(v[0]), v[1], v[2],
               reinterpret_cast<const float*>(v[3]), v[4], v[5], v[6],
               reinterpret_cast<float*>(v[7]), v[8], v[9],
               v[10], v[11], v[12], v[13]};
  Py_BEGIN_ALLOW_THREADS
  gemm(g, static_cast<int>(v[14]), static_cast<int>(v[15]));
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

// exp(x, y, n, threads, isa): y = exp(x) over n contiguous floats (y may be x).
PyObject* py_exp(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  long v[5];
  if (!parse_longs("exp", args, nargs, 5, v) || !check_call("exp", {v[2]}, v[4])) return nullptr;
  Py_BEGIN_ALLOW_THREADS
  exp_elements(reinterpret_cast<const float*>(v[0]), reinterpret_cast<float*>(v[1]), v[2],
               static_cast<int>(v[3]), static_cast<int>(v[4]));
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

// silu_mul(gu, out, rows, inner, gu_ld, out_ld, threads, isa)
PyObject* py_silu_mul(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  long v[8];
  if (!parse_longs("silu_mul", args, nargs, 8, v) || !check_call("silu_mul", {v[2], v[3]}, v[7]))
    return nullptr;
  Py_BEGIN_ALLOW_THREADS
  silu_mul(reinterpret_cast<const float*>(v[0]), reinterpret_cast<float*>(v[1]), v[2], v[3], v[4],
           v[5], static_cast<int>(v[6]), static_cast<int>(v[7]));
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* py_isa(PyObject*, PyObject*) {
  return PyUnicode_FromString(has_avx2() ? "avx2" : "portable");
}

PyMethodDef METHODS[] = {
    {"gemm", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_gemm)), METH_FASTCALL,
     "C = A @ B over strided float32 buffers; every element one sequential FMA chain."},
    {"exp", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_exp)), METH_FASTCALL,
     "y = exp(x) over contiguous float32 buffers; the same bits on every path."},
    {"silu_mul", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_silu_mul)),
     METH_FASTCALL, "out = silu(gate) * up over rows of a fused [gate | up] float32 buffer."},
    {"isa", py_isa, METH_NOARGS, "The kernel ISA_AUTO picks on this CPU: 'avx2' or 'portable'."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_pdkernels", nullptr, -1, METHODS,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__pdkernels() {
  PyObject* mod = PyModule_Create(&MODULE);
  if (mod == nullptr) return nullptr;
  if (PyModule_AddIntConstant(mod, "NR", NR) < 0 || PyModule_AddIntConstant(mod, "MR", MR) < 0 ||
      PyModule_AddIntConstant(mod, "ISA_AUTO", ISA_AUTO) < 0 ||
      PyModule_AddIntConstant(mod, "ISA_PORTABLE", ISA_PORTABLE) < 0 ||
      PyModule_AddIntConstant(mod, "ISA_AVX2", ISA_AVX2) < 0) {
    Py_DECREF(mod);
    return nullptr;
  }
  return mod;
}
