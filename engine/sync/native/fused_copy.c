/* The host weight-sync path's copy and delivery fingerprint in one pass over the bytes (engine/sync/native).
 *
 * Fingerprint (engine/sync/flat.py): the region's little-endian 8-byte words w_i, global word number g + i,
 *     total   = sum of all w_i                       (mod 2^64)
 *     strided = sum of the w_i with (g + i) % 7 == 0 (mod 2^64)
 * the same two sums as `Fingerprint.add`, bit for bit, for any g.
 *
 * asyncrl_copy_fp copies the first n bytes of src to dst and returns the sums of the `seen` region
 * (seen_len bytes, a multiple of 8, n <= seen_len). `seen` is dst or src (the caller checks), so the words of
 * seen below n & ~7 are the words copied: they are summed from the registers they were loaded into, the rest
 * of seen (the word holding the copy's last bytes, the padding) is read after the copy. n = 0: sums only.
 *
 * Summing: 7 vector accumulators, one per vector of a block of 7 vectors (7 x 8 words with AVX-512, 7 x 4 with
 * AVX2, 7 x 2 with SSE2; without SIMD one word at a time). A block is a multiple of 7 words, so a word's lane and accumulator fix its global index
 * mod 7: the strided sum is a fixed selection of the accumulators' lanes, taken once at the end.
 * Loads: prefetched PREFETCH bytes ahead. Stores: non-temporal (streamed past the cache, no read-for-ownership)
 * when `nt` and dst aligns to the vector after a few scalar words; regular stores otherwise; _mm_sfence() after
 * streaming. A streaming copy runs in 8 interleaved page streams (`superblocks`: ~1.3x one stream here).
 *
 * asyncrl_copy_fp_batch does `count` such copies in one call (a bucket's tensors: no interpreter between them)
 * and returns the sums of all their `seen` regions added together (the fingerprint is a sum over disjoint
 * regions, so their order does not matter).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define ASYNCRL_NATIVE_ABI 3

int asyncrl_native_abi(void) { return ASYNCRL_NATIVE_ABI; }

static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

/* nw words from src (global word number g): copied to dst when dst != NULL, summed. */
static void scalar_words(uint8_t *dst, const uint8_t *src, size_t nw, uint64_t g, uint64_t *tot, uint64_t *str) {
    uint64_t t = 0, s = 0;
    unsigned r = (unsigned)(g % 7);
    for (size_t i = 0; i < nw; i++) {
        uint64_t w = load_le64(src + 8 * i);
        if (dst) memcpy(dst + 8 * i, src + 8 * i, 8);
        t += w;
        if (r == 0) s += w;
        if (++r == 7) r = 0;
    }
    *tot += t;
    *str += s;
}

/* Adds the lanes of the 7 accumulators (lane l of accumulator k = words with global index = g + W*k + l mod 7). */
static void fold(const uint64_t *lanes, unsigned width, uint64_t g, uint64_t *tot, uint64_t *str) {
    for (unsigned k = 0; k < 7; k++)
        for (unsigned l = 0; l < width; l++) {
            uint64_t w = lanes[k * width + l];
            *tot += w;
            if ((g + (uint64_t)width * k + l) % 7 == 0) *str += w;
        }
}

#if defined(__AVX512F__)
#define VW 8 /* words per vector */
typedef __m512i vec;
#define VZERO() _mm512_setzero_si512()
#define VLOAD(p) _mm512_loadu_si512((const void *)(p))
#define VSTORE(p, v) _mm512_storeu_si512((void *)(p), (v))
#define VSTREAM(p, v) _mm512_stream_si512((void *)(p), (v))
#define VADD(a, b) _mm512_add_epi64((a), (b))
#define VSAVE(p, v) _mm512_storeu_si512((void *)(p), (v))
#define ASYNCRL_ISA "avx512"
#elif defined(__AVX2__)
#define VW 4
typedef __m256i vec;
#define VZERO() _mm256_setzero_si256()
#define VLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VSTORE(p, v) _mm256_storeu_si256((__m256i *)(p), (v))
#define VSTREAM(p, v) _mm256_stream_si256((__m256i *)(p), (v))
#define VADD(a, b) _mm256_add_epi64((a), (b))
#define VSAVE(p, v) _mm256_storeu_si256((__m256i *)(p), (v))
#define ASYNCRL_ISA "avx2"
#elif defined(__SSE2__)
#define VW 2
typedef __m128i vec;
#define VZERO() _mm_setzero_si128()
#define VLOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define VSTORE(p, v) _mm_storeu_si128((__m128i *)(p), (v))
#define VSTREAM(p, v) _mm_stream_si128((__m128i *)(p), (v))
#define VADD(a, b) _mm_add_epi64((a), (b))
#define VSAVE(p, v) _mm_storeu_si128((__m128i *)(p), (v))
#define ASYNCRL_ISA "sse2"
#endif

const char *asyncrl_native_isa(void) {
#ifdef VW
    return ASYNCRL_ISA;
#else
    return "scalar";
#endif
}

#ifdef VW
#define BLOCK (7 * VW * 8) /* bytes per block */
#define PREFETCH 3584      /* bytes ahead the loads are prefetched (+6-10 % over the hardware prefetcher alone here) */

/* mode 0: sum only; 1: copy with regular stores; 2: copy with streaming stores (dst aligned to the vector). */
static inline __attribute__((always_inline)) void blocks(uint8_t *dst, const uint8_t *src, size_t nblocks, int mode,
                                                         vec acc[7]) {
    vec a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3], a4 = acc[4], a5 = acc[5], a6 = acc[6];
    for (size_t b = 0; b < nblocks; b++) {
        const uint8_t *s = src + b * BLOCK;
        for (unsigned o = 0; o < BLOCK; o += 64) _mm_prefetch((const char *)(s + PREFETCH + o), _MM_HINT_T0);
        vec v0 = VLOAD(s), v1 = VLOAD(s + 8 * VW), v2 = VLOAD(s + 16 * VW), v3 = VLOAD(s + 24 * VW);
        vec v4 = VLOAD(s + 32 * VW), v5 = VLOAD(s + 40 * VW), v6 = VLOAD(s + 48 * VW);
        if (mode == 1) {
            uint8_t *d = dst + b * BLOCK;
            VSTORE(d, v0); VSTORE(d + 8 * VW, v1); VSTORE(d + 16 * VW, v2); VSTORE(d + 24 * VW, v3);
            VSTORE(d + 32 * VW, v4); VSTORE(d + 40 * VW, v5); VSTORE(d + 48 * VW, v6);
        } else if (mode == 2) {
            uint8_t *d = dst + b * BLOCK;
            VSTREAM(d, v0); VSTREAM(d + 8 * VW, v1); VSTREAM(d + 16 * VW, v2); VSTREAM(d + 24 * VW, v3);
            VSTREAM(d + 32 * VW, v4); VSTREAM(d + 40 * VW, v5); VSTREAM(d + 48 * VW, v6);
        }
        a0 = VADD(a0, v0); a1 = VADD(a1, v1); a2 = VADD(a2, v2); a3 = VADD(a3, v3);
        a4 = VADD(a4, v4); a5 = VADD(a5, v5); a6 = VADD(a6, v6);
    }
    acc[0] = a0; acc[1] = a1; acc[2] = a2; acc[3] = a3; acc[4] = a4; acc[5] = a5; acc[6] = a6;
}
/* Streaming copies in STREAMS interleaved streams: a superblock of STREAMS x STREAM_BYTES is copied one block
 * of each stream in turn, so the loads and the non-temporal stores run in STREAMS pages at once (glibc's
 * large_memcpy_4x does the same). One stream alone copies + sums at ~6.8 GB/s here, below glibc's memcpy
 * (~7.4-8.2); 8 streams at ~9.1-9.3 (one-off microbenchmark, 96 and 512 MiB, 2026-12-03, issue 24 eighth pass).
 * STREAM_BYTES = 7 pages: a multiple of 7 words and of every ISA's BLOCK, so a block at the same offset in each
 * stream has the same word index mod 7 and all streams share the 7 accumulators. */
#ifndef STREAMS
#define STREAMS 8
#endif
#define STREAM_BYTES (7 * 4096)
#define SUPER (STREAMS * STREAM_BYTES)

static inline __attribute__((always_inline)) void superblocks(uint8_t *dst, const uint8_t *src, size_t nsuper,
                                                              vec acc[7]) {
    vec a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3], a4 = acc[4], a5 = acc[5], a6 = acc[6];
    for (size_t q = 0; q < nsuper; q++) {
        const uint8_t *s0 = src + q * SUPER;
        uint8_t *d0 = dst + q * SUPER;
        for (size_t i = 0; i < STREAM_BYTES; i += BLOCK)
            for (unsigned j = 0; j < STREAMS; j++) {
                const uint8_t *s = s0 + j * STREAM_BYTES + i;
                uint8_t *d = d0 + j * STREAM_BYTES + i;
                vec v0 = VLOAD(s), v1 = VLOAD(s + 8 * VW), v2 = VLOAD(s + 16 * VW), v3 = VLOAD(s + 24 * VW);
                vec v4 = VLOAD(s + 32 * VW), v5 = VLOAD(s + 40 * VW), v6 = VLOAD(s + 48 * VW);
                VSTREAM(d, v0); VSTREAM(d + 8 * VW, v1); VSTREAM(d + 16 * VW, v2); VSTREAM(d + 24 * VW, v3);
                VSTREAM(d + 32 * VW, v4); VSTREAM(d + 40 * VW, v5); VSTREAM(d + 48 * VW, v6);
                a0 = VADD(a0, v0); a1 = VADD(a1, v1); a2 = VADD(a2, v2); a3 = VADD(a3, v3);
                a4 = VADD(a4, v4); a5 = VADD(a5, v5); a6 = VADD(a6, v6);
            }
    }
    acc[0] = a0; acc[1] = a1; acc[2] = a2; acc[3] = a3; acc[4] = a4; acc[5] = a5; acc[6] = a6;
}
#endif

/* nw words from src at global word g, copied to dst (if not NULL), summed into tot/str; streams when nt. */
static int run_words(uint8_t *dst, const uint8_t *src, size_t nw, uint64_t g, int nt, uint64_t *tot, uint64_t *str) {
    int streamed = 0;
#ifdef VW
    size_t head = 0;
    int mode = dst == NULL ? 0 : 1;
    if (mode == 1 && nt && ((uintptr_t)dst & 7) == 0) {
        head = ((size_t)(-(uintptr_t)dst) & (VW * 8 - 1)) / 8; /* scalar words until dst is vector-aligned */
        mode = 2;
    }
    if (head > nw) head = nw;
    scalar_words(dst, src, head, g, tot, str);
    size_t done = head;
    size_t nblocks = (nw - done) / (7 * VW);
    if (nblocks) {
        vec acc[7];
        for (int k = 0; k < 7; k++) acc[k] = VZERO();
        const uint8_t *s = src + 8 * done;
        uint8_t *d = dst ? dst + 8 * done : NULL;
        if (mode == 0) blocks(d, s, nblocks, 0, acc);
        else if (mode == 1) blocks(d, s, nblocks, 1, acc);
        else {
            size_t nsuper = nblocks * BLOCK / SUPER; /* the interleaved part, then the rest block by block */
            superblocks(d, s, nsuper, acc);
            blocks(d + nsuper * SUPER, s + nsuper * SUPER, nblocks - nsuper * (SUPER / BLOCK), 2, acc);
            streamed = 1;
        }
        uint64_t lanes[7 * VW];
        for (int k = 0; k < 7; k++) VSAVE(lanes + k * VW, acc[k]);
        fold(lanes, VW, g + done, tot, str);
        done += nblocks * 7 * VW;
    }
    scalar_words(dst ? dst + 8 * done : NULL, src + 8 * done, nw - done, g + done, tot, str);
#else
    (void)nt;
    scalar_words(dst, src, nw, g, tot, str);
#endif
    return streamed;
}

/* See the file's comment. out[0] = total, out[1] = strided. */
void asyncrl_copy_fp(uint8_t *dst, const uint8_t *src, size_t n, const uint8_t *seen, size_t seen_len, uint64_t g,
                     int nt, uint64_t *out) {
    uint64_t tot = 0, str = 0;
    if (n > seen_len) n = seen_len;
    size_t nw = n / 8;
    int streamed = nw ? run_words(dst, src, nw, g, nt, &tot, &str) : 0;
    if (n > 8 * nw) memcpy(dst + 8 * nw, src + 8 * nw, n - 8 * nw);
#if defined(__SSE2__)
    if (streamed) _mm_sfence();
#else
    (void)streamed;
#endif
    run_words(NULL, seen + 8 * nw, seen_len / 8 - nw, g + nw, 0, &tot, &str);
    out[0] = tot;
    out[1] = str;
}

/* The sums of `len` bytes (a multiple of 8) at global word g. */
void asyncrl_sum_fp(const uint8_t *p, size_t len, uint64_t g, uint64_t *out) {
    asyncrl_copy_fp(NULL, p, 0, p, len, g, 0, out);
}

void asyncrl_copy_fp_sample_batch(size_t count, const uint64_t *dst, const uint64_t *src, const uint64_t *n,
                                  const uint64_t *seen, const uint64_t *seen_len, const uint64_t *g, size_t nt_min,
                                  int zero_pad, size_t stride, uint64_t *samples, uint64_t *out);

#define SAMPLE_CHUNK (4 * 8 * 7 * 4096) /* bytes copied before their sampled bytes are read back (in L2) */

/* asyncrl_copy_fp, and with stride > 0 also *sample = the sum of the bytes src[0], src[stride], src[2 stride],
 * ... below n (engine.sync.verify.weights_fingerprint's per-tensor sum of the destination, which the copy made
 * equal to src): the copy runs in SAMPLE_CHUNK pieces and each piece's sampled bytes are read right after it,
 * from the cache its loads filled. The fingerprint is the same as one call's (the sums are linear). */
static void copy_sampled(uint8_t *d, const uint8_t *s, size_t n, const uint8_t *seen, size_t seen_len, uint64_t g,
                         int nt, size_t stride, uint64_t *sample, uint64_t *out) {
    uint64_t one[2], smp = 0;
    size_t o = 0;
    if (n > seen_len) n = seen_len;
    out[0] = out[1] = 0;
    if (stride)
        for (; n - o > SAMPLE_CHUNK; o += SAMPLE_CHUNK) {
            asyncrl_copy_fp(d + o, s + o, SAMPLE_CHUNK, seen + o, SAMPLE_CHUNK, g + o / 8, nt, one);
            out[0] += one[0];
            out[1] += one[1];
            for (size_t j = (o + stride - 1) / stride * stride; j < o + SAMPLE_CHUNK; j += stride) smp += s[j];
        }
    asyncrl_copy_fp(n ? d + o : d, n ? s + o : s, n - o, seen + o, seen_len - o, g + o / 8, nt, one);
    out[0] += one[0];
    out[1] += one[1];
    if (stride)
        for (size_t j = (o + stride - 1) / stride * stride; j < n; j += stride) smp += s[j];
    if (sample) *sample = smp;
}

/* count copies: for each i, asyncrl_copy_fp(dst[i], src[i], n[i], seen[i], seen_len[i], g[i], n[i] >= nt_min);
 * with zero_pad, first dst[i][n[i] .. seen_len[i]) = 0 (the sender's padding; seen[i] is dst[i] then). dst[i]
 * = 0 with n[i] = 0: sums only. out = the sums of all regions (mod 2^64). */
void asyncrl_copy_fp_batch(size_t count, const uint64_t *dst, const uint64_t *src, const uint64_t *n,
                           const uint64_t *seen, const uint64_t *seen_len, const uint64_t *g, size_t nt_min,
                           int zero_pad, uint64_t *out) {
    asyncrl_copy_fp_sample_batch(count, dst, src, n, seen, seen_len, g, nt_min, zero_pad, 0, NULL, out);
}

/* asyncrl_copy_fp_batch, and with stride > 0 samples[i] = the sum of src[i]'s bytes 0, stride, 2 stride, ...
 * below n[i] (copy_sampled; 0 where n[i] = 0). */
void asyncrl_copy_fp_sample_batch(size_t count, const uint64_t *dst, const uint64_t *src, const uint64_t *n,
                                  const uint64_t *seen, const uint64_t *seen_len, const uint64_t *g, size_t nt_min,
                                  int zero_pad, size_t stride, uint64_t *samples, uint64_t *out) {
    uint64_t tot = 0, str = 0, one[2];
    for (size_t i = 0; i < count; i++) {
        uint8_t *d = (uint8_t *)(uintptr_t)dst[i];
        if (zero_pad && d && seen_len[i] > n[i]) memset(d + n[i], 0, seen_len[i] - n[i]);
        copy_sampled(d, (const uint8_t *)(uintptr_t)src[i], n[i], (const uint8_t *)(uintptr_t)seen[i], seen_len[i],
                     g[i], n[i] >= nt_min, n[i] ? stride : 0, samples ? samples + i : NULL, one);
        if (samples && !n[i]) samples[i] = 0;
        tot += one[0];
        str += one[1];
    }
    out[0] = tot;
    out[1] = str;
}
