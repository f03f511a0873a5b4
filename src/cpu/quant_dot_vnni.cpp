// The AVX2 kernels of quant_dot_avx2.cpp compiled a second time, in namespace avx2vnni, with
// -mavxvnni: the scale-1 blocks (Q8_0, Q4_0, Q4_1, the four-row Q4_1, Q8_K) sum each 4 products
// with one vpdpbusd instead of maddubs + madd. The int32 sums are the same (quant_dot_avx2.cpp
// says why), so every result equals the AVX2 kernels' bit for bit (tested); quant_dot.cpp picks
// these when the CPU has AVX-VNNI (and LYCHEE_QUANT_VNNI is not 0).
#define LY_QUANT_NS avx2vnni
#define LY_QUANT_VNNI 1
#include "cpu/quant_dot_avx2.cpp"
