// The eight-row kernels of quant_pack_avx2.cpp compiled a second time, in namespace avx2vnni, with
// -mavxvnni: the pair sums as vpdpbusd. The int32 block sums are the same integers, so every
// result equals the AVX2 build's (and the scalar kernels') bit for bit (tested).
#define LY_QUANT_NS avx2vnni
#define LY_QUANT_VNNI 1
#include "cpu/quant_pack_avx2.cpp"
