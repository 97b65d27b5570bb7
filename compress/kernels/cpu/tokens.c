/* A step's token choices: greedy arg max and sampling, whole rows in one call. */
#include "tokens_ref.h"
#if defined(__AVX2__)
#include "tokens_avx2.h"
#define row_max row_max_avx2
#define first_index first_index_avx2
#define block_weights block_weights_avx2
#else
#define row_max row_max_ref
#define first_index first_index_ref
#define block_weights block_weights_ref
#endif

/* The index of the largest of x [n], the first on ties and the first NaN if any, as
 * torch.argmax: greedy decoding's choice, which torch takes 70-90 us for over a 49k-word
 * vocabulary on two cores (a thread team woken for one reduction). Vectorized: the
 * maximum (and whether any NaN) in one pass, then its first index, eight at a time
 * (compared one by one: 25 us of a 49k-word row here, now 8). */
int64_t llmp_argmax(const float *x, int64_t n) {
    int nan; /* the largest, or the first NaN */
    float m = row_max(x, n, &nan);
    return first_index(x, n, m, nan);
}


/* ---- A step's token choices in one call ---------------------------------------------
 * Per row: greedy (it[r] == 0) is llmp_argmax; sampled is the first token whose running
 * total of exp((x - max) * it) exceeds u[r] times the row's total (it: 1 / temperature;
 * u uniform in [0, 1)), so a token of weight 0 is never drawn. Per row and token this is
 * compress/draw.py's inverse cumulative over the tempered exponentials, with the
 * exponentials in float32 (exp8: relative error ~2e-7) where torch took float64: a
 * sampled batch-32 step spent a fifth of its time in 32 rows' tensor operations. Weights
 * are summed in blocks of 64 in a fixed order, block totals in float64. out[r] = -1: no
 * token can be drawn (NaN, +inf, or all -inf). */

/* Weights of one block (64 logits from x, `n` <= 64 real) into w, and their float64 sum. */
static double draw_block(const float *x, int n, float m, float it, float *w) {
    float pad[DRAW_BLOCK]; /* the last block: -inf (weight 0) past the vocabulary */
    const float *t = x;
    if (n < DRAW_BLOCK) {
        for (int i = 0; i < DRAW_BLOCK; i++) pad[i] = i < n ? x[i] : -INFINITY;
        t = pad;
    }
    return block_weights(t, m, it, w);
}

/* The k-th largest of x[0..n) (k <= n, no NaN): a min-heap of the k largest so far, most
 * values turned away by one comparison with its top. */
static float kth_largest(const float *x, int64_t n, int64_t k, float *heap) {
    int64_t size = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (size == k) {
            if (v <= heap[0]) continue;
            int64_t j = 0; /* replace the top, sift down */
            for (;;) {
                int64_t c = 2 * j + 1;
                if (c >= k) break;
                if (c + 1 < k && heap[c + 1] < heap[c]) c++;
                if (heap[c] >= v) break;
                heap[j] = heap[c], j = c;
            }
            heap[j] = v;
        } else {
            int64_t j = size++; /* append, sift up */
            while (j > 0 && heap[(j - 1) / 2] > v) heap[j] = heap[(j - 1) / 2], j = (j - 1) / 2;
            heap[j] = v;
        }
    }
    return heap[0];
}

static int desc_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

#define NUCLEUS_BUCKETS 4096 /* by a positive float's top 12 bits: 1/16 of an octave each */

/* top-p's cut: the weights w[0..n) (>= 0) sorted from the largest, the fewest whose sum
 * reaches p * total are kept (sampling.probabilities: a token is kept while the mass
 * before it is under p). Returns the smallest kept weight; *ties: how many tokens of
 * exactly that weight are kept (the first by index); *kept: the kept weights' sum. Found
 * from a histogram of the weights' mass and a sort of the one bucket the cut falls in,
 * not a sort of the vocabulary (torch's sort was 4 ms a 49k row). */
static float nucleus(const float *w, int64_t n, double p, double total, int64_t *ties,
                     double *kept, double *mass, int64_t *count, float *pool) {
    memset(mass, 0, sizeof(double) * NUCLEUS_BUCKETS);
    memset(count, 0, sizeof(int64_t) * NUCLEUS_BUCKETS);
    for (int64_t i = 0; i < n; i++) {
        if (w[i] <= 0.f) continue;
        uint32_t bits;
        memcpy(&bits, w + i, 4);
        mass[bits >> 20] += w[i], count[bits >> 20]++;
    }
    double goal = p * total, before = 0.0;
    int b = -1, last = -1;
    for (int c = NUCLEUS_BUCKETS - 1; c >= 0; c--) {
        if (!count[c]) continue;
        last = c;
        if (before + mass[c] >= goal) {
            b = c;
            break;
        }
        before += mass[c];
    }
    if (b < 0) b = last, before -= mass[last]; /* rounding kept the goal out of reach */
    int64_t m = 0; /* the bucket's weights, from the largest */
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, w + i, 4);
        if (w[i] > 0.f && (int)(bits >> 20) == b) pool[m++] = w[i];
    }
    qsort(pool, (size_t)m, sizeof(float), desc_float);
    int64_t j = 0;
    double run = before;
    for (; j < m; j++) { /* kept while the mass before it is under the goal */
        if (run >= goal && j > 0) break;
        run += pool[j];
    }
    float cut = pool[j - 1];
    int64_t t = 0;
    for (int64_t i = 0; i < j; i++) t += pool[i] == cut;
    *ties = t, *kept = run;
    return cut;
}

/* A sampled row: sampling.probabilities' distribution (top-k where k > 0, top-p where
 * p < 1) drawn by the inverse cumulative in index order. Without a top-p cut every
 * weighted token is kept, and the draw skips whole blocks by their totals. scratch: the
 * weights (whole blocks of 64), k or a bucket's weights (vocab), the histogram; totals:
 * a float64 a block. */
static int64_t draw_row(const float *x, int64_t vocab, float it, int64_t k, double p,
                        double u, float *scratch, double *totals) {
    int bad;
    float m = row_max(x, vocab, &bad);
    if (bad || m == INFINITY || m == -INFINITY) return -1;
    int64_t nb = (vocab + DRAW_BLOCK - 1) / DRAW_BLOCK;
    float *w = scratch, *pool = scratch + nb * DRAW_BLOCK;
    float floor = k > 0 && k < vocab ? kth_largest(x, vocab, k, pool) : -INFINITY;
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) { /* the tempered weights, less those under the k-th */
        int n = vocab - b * DRAW_BLOCK < DRAW_BLOCK ? (int)(vocab - b * DRAW_BLOCK) : DRAW_BLOCK;
        float *wb = w + b * DRAW_BLOCK;
        totals[b] = draw_block(x + b * DRAW_BLOCK, n, m, it, wb);
        if (floor > -INFINITY) {
            totals[b] = 0.0;
            for (int i = 0; i < n; i++)
                totals[b] += wb[i] = x[b * DRAW_BLOCK + i] >= floor ? wb[i] : 0.f;
        }
        total += totals[b];
    }
    float cut = 0.f;
    int64_t ties = 0, limited = p < 1.0; /* then only the first `ties` tokens of weight `cut` */
    if (limited) {
        double *mass = (double *)(pool + (vocab + 1) / 2 * 2); /* 8-byte aligned */
        int64_t *count = (int64_t *)(mass + NUCLEUS_BUCKETS);
        cut = nucleus(w, vocab, p, total, &ties, &total, mass, count, pool);
    }
    double target = u * total;
    if (target >= total) target = nextafter(total, 0.0);
    double run = 0.0;
    int64_t start = 0;
    if (!limited) { /* the block the target falls in (a rounding miss: the last weighted) */
        int64_t b = 0, last = 0;
        for (; b < nb; b++) {
            if (totals[b] > 0) last = b;
            if (run + totals[b] > target) break;
            run += totals[b];
        }
        if (b == nb) b = last, run = total - totals[last];
        start = b * DRAW_BLOCK;
    }
    int64_t pick = -1;
    for (int64_t i = start; i < vocab; i++) {
        float v = w[i];
        if (v <= 0.f || v < cut) continue;
        if (limited && v == cut) {
            if (ties == 0) continue;
            ties--;
        }
        pick = i;
        run += v;
        if (run > target) break;
    }
    return pick;
}

void llmp_choose_tokens(const float *logits, int64_t rows, int64_t vocab, const float *it,
                        const int64_t *top_k, const double *top_p, const double *u,
                        int64_t *out) {
    int64_t nb = (vocab + DRAW_BLOCK - 1) / DRAW_BLOCK;
    int sampled = 0;
    for (int64_t r = 0; r < rows; r++) sampled |= it[r] != 0.f;
    #pragma omp parallel if (rows > 1)
    {
        /* weights, the k largest or a bucket's weights, and the histogram (8-byte aligned) */
        size_t room = (size_t)(nb * DRAW_BLOCK + vocab) + 4 * NUCLEUS_BUCKETS + 2;
        float *scratch = sampled ? malloc(sizeof(float) * room) : NULL;
        double *totals = sampled ? malloc(sizeof(double) * (size_t)nb) : NULL;
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *x = logits + r * vocab;
            if (it[r] == 0.f)
                out[r] = llmp_argmax(x, vocab);
            else
                out[r] = scratch && totals
                             ? draw_row(x, vocab, it[r], top_k[r], top_p[r], u[r], scratch, totals)
                             : -2;
        }
        free(scratch), free(totals);
    }
}
