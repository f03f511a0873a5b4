"""A warp-level emulation of the FP8 decode kernel's fragment plumbing (src/cuda/kernels/
decode_attention_fp8.cuh: attend_tile_fp8, fp8_tile_offset, write_item's kPairedDims), written from
the PTX ISA's fragment layouts of mma.m16n8k16 (A row g = lane / 4, k = 2 t4.., B k = 2 t4.., n = g)
and ldmatrix(.trans): codes placed by the swizzle, Q in the permuted dims, K words read per lane, V
through ldmatrix.x4.trans + the 0x3120 byte permute, the outputs read back in the paired-dims layout,
against plain sums; and the bank groups of the K loads, the V ldmatrix phases and the cp.async
phases. Values are integers (no e4m3 rounding): it checks the index mappings, not the arithmetic,
which the GPU tests check (tests/test_cuda_kv_fp8.cpp). Mutations (the permute left out, an
unswizzled read, the paired dims swapped) fail it."""
import random
random.seed(1)
class R:
    def integers(self, lo, hi, size): return [[random.randrange(lo, hi) for _ in range(size[1])] for _ in range(size[0])]
    def normal(self, size): return [[random.gauss(0, 1) for _ in range(size[1])] for _ in range(size[0])]
rng = R()

def off(d, row, chunk):
    sw = (row & 7) if d >= 128 else ((row >> 1) & 3)
    return row * d + ((chunk ^ sw) << 4)

def mma(Afr, Bfr):
    # Afr[lane] = (a0, a1, a2, a3) pairs as tuples of 2 values; Bfr[lane] = (b0, b1) pairs.
    A = [[0.0]*16 for _ in range(16)]; B = [[0.0]*8 for _ in range(16)]
    for lane in range(32):
        g, t4 = lane >> 2, lane & 3
        a0, a1, a2, a3 = Afr[lane]
        A[g][2*t4], A[g][2*t4+1] = a0; A[g+8][2*t4], A[g+8][2*t4+1] = a1
        A[g][2*t4+8], A[g][2*t4+9] = a2; A[g+8][2*t4+8], A[g+8][2*t4+9] = a3
        b0, b1 = Bfr[lane]
        B[2*t4][g], B[2*t4+1][g] = b0; B[2*t4+8][g], B[2*t4+9][g] = b1
    D = [[sum(A[i][k] * B[k][j] for k in range(16)) for j in range(8)] for i in range(16)]
    return [(D[l >> 2][2*(l & 3)], D[l >> 2][2*(l & 3)+1], D[(l >> 2)+8][2*(l & 3)], D[(l >> 2)+8][2*(l & 3)+1]) for l in range(32)]

def run(d, warp):
    T = 64
    K = rng.integers(0, 256, size=(T, d)); V = rng.integers(0, 256, size=(T, d))
    val = lambda c: float(c) - 128.0
    smemK = [0] * (T * d); smemV = [0] * (T * d)
    for r in range(T):
        for j in range(d):
            smemK[off(d, r, j // 16) + j % 16] = K[r][j]; smemV[off(d, r, j // 16) + j % 16] = V[r][j]
    q = rng.normal(size=(8, d))
    KS = d // 16; LC = KS // 4; D4 = d // 4
    # Q fragments: lane (g, t4): qf[ks] = dims t4*D4 + 4ks + (0,1) | (2,3)
    qf = [[((q[l >> 2][(l & 3)*D4 + 4*ks], q[l >> 2][(l & 3)*D4 + 4*ks + 1]),
            (q[l >> 2][(l & 3)*D4 + 4*ks + 2], q[l >> 2][(l & 3)*D4 + 4*ks + 3])) for ks in range(KS)] for l in range(32)]
    s = [[[0.0]*4 for _ in range(2)] for _ in range(32)]
    for n in range(2):
        words = []
        for l in range(32):
            g, t4 = l >> 2, l & 3
            row = warp*16 + 8*n + g
            w = []
            for c in range(LC):
                base = off(d, row, t4*LC + c)
                for j in range(4):
                    w.append([smemK[base + 4*j + b] for b in range(4)])
            words.append(w)
        for ks in range(KS):
            Afr = [(qf[l][ks][0], (0, 0), qf[l][ks][1], (0, 0)) for l in range(32)]
            Bfr = [((val(words[l][ks][0]), val(words[l][ks][1])), (val(words[l][ks][2]), val(words[l][ks][3]))) for l in range(32)]
            out = mma(Afr, Bfr)
            for l in range(32):
                for i in range(4): s[l][n][i] += out[l][i]
    for l in range(32):
        g, t4 = l >> 2, l & 3
        for n in range(2):
            for i in range(2):
                tok = warp*16 + 8*n + 2*t4 + i
                want = sum(q[g][j] * val(K[tok][j]) for j in range(d))
                assert abs(s[l][n][i] - want) < 1e-6 * (1 + abs(want)), (l, n, i, s[l][n][i], want)
    # P: arbitrary per (g, token); lane (g, t4): p[n][i] = P[g][8n + 2t4 + i]
    P = rng.normal(size=(8, 16))
    pa0 = [(P[l >> 2][2*(l & 3)], P[l >> 2][2*(l & 3)+1]) for l in range(32)]
    pa2 = [(P[l >> 2][8 + 2*(l & 3)], P[l >> 2][8 + 2*(l & 3)+1]) for l in range(32)]
    o = [[[0.0]*4 for _ in range(d // 8)] for _ in range(32)]
    for np_ in range(d // 32):  # kChunksPerRow / 2
        # ldmatrix.x4.trans: lane l gives the address of row (l & 7) of matrix l >> 3
        addrs = [0]*32
        for l in range(32):
            v_row = warp*16 + (((l >> 3) & 1) << 3) + (l & 7)
            addrs[l] = off(d, v_row, 2*np_ + (l >> 4))
        b = [[None]*4 for _ in range(32)]
        for mq in range(4):
            M = [[(smemV[addrs[8*mq + r] + 2*c], smemV[addrs[8*mq + r] + 2*c + 1]) for c in range(8)] for r in range(8)]
            for l in range(32):
                r0, col = 2*(l & 3), l >> 2
                b[l][mq] = list(M[r0][col]) + list(M[r0 + 1][col])  # bytes 0..3, low b16 first
        for h in range(2):
            prm = lambda x: [x[0], x[2], x[1], x[3]]
            Bfr_e, Bfr_o = [], []
            for l in range(32):
                x0, x1 = prm(b[l][2*h]), prm(b[l][2*h + 1])
                Bfr_e.append(((val(x0[0]), val(x0[1])), (val(x1[0]), val(x1[1]))))
                Bfr_o.append(((val(x0[2]), val(x0[3])), (val(x1[2]), val(x1[3]))))
            Afr = [(pa0[l], (0, 0), pa2[l], (0, 0)) for l in range(32)]
            oe, oo = mma(Afr, Bfr_e), mma(Afr, Bfr_o)
            for l in range(32):
                for i in range(4):
                    o[l][4*np_ + 2*h][i] += oe[l][i]; o[l][4*np_ + 2*h + 1][i] += oo[l][i]
    # paired dims: o[2c + j][i] holds dim 16c + 4t4 + 2i + j
    for l in range(32):
        g, t4 = l >> 2, l & 3
        for c in range(d // 16):
            for j in range(2):
                for i in range(2):
                    dim = 16*c + 4*t4 + 2*i + j
                    want = sum(P[g][t] * val(V[warp*16 + t][dim]) for t in range(16))
                    got = o[l][2*c + j][i]
                    assert abs(got - want) < 1e-6 * (1 + abs(want)), (d, l, c, j, i, got, want)
    # bank conflicts: K loads (per quarter warp), V ldmatrix phases, cp.async phases
    for n in range(2):
        for c in range(LC):
            for qw in range(4):
                groups = set()
                for l in range(8*qw, 8*qw + 8):
                    g, t4 = l >> 2, l & 3
                    a = off(d, warp*16 + 8*n + g, t4*LC + c)
                    groups.add((a % 128) // 16)
                assert len(groups) == 8, ("K conflict", d, n, c, qw, groups)
    for mq in range(4):
        groups = {(addrs[8*mq + r] % 128) // 16 for r in range(8)}
        assert len(groups) == 8, ("V conflict", d, mq)
    chunks = d // 16; rows_per_pass = 128 // chunks
    for ph in range(16):
        groups = {(off(d, t // chunks, t % chunks) % 128) // 16 for t in range(8*ph, 8*ph + 8)}
        assert len(groups) == 8, ("cp.async conflict", d, ph)
    return True


def test_fragments_and_banks_at_both_head_dims():
    for d in (64, 128):
        for warp in range(4):
            assert run(d, warp)


if __name__ == "__main__":
    test_fragments_and_banks_at_both_head_dims()
    print("ok")
