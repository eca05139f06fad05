/* Fused JPEG decode-and-crop over the libjpeg API: decode only the crop, resize it, flip it, in one call.
 *
 * Written by hand because no library does this: PIL and torchvision decode the whole image before cropping,
 * and TurboJPEG's lossless crop re-encodes. The libjpeg API can skip the scanlines above a crop, decode only
 * the iMCU columns that cover it, stop at its bottom edge, and decode at 1/2, 1/4 or 1/8 scale.
 *
 * Errors never reach libjpeg's default handler (which calls exit()): they longjmp back here and become a
 * DecodeError, and so do the warnings after which the pixels are no longer the file's (see warn()). Every call
 * first checks, from the header alone, that the image is within the caller's pixel limit and the crop inside it,
 * so no file makes a call loop or allocate more than an image at the limit needs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>
#include <jpeglib.h>

#include <jerror.h> /* after jpeglib.h: its jconfig.h enables the arithmetic-coding messages */

static PyObject *DecodeError;
static unsigned long long corrupt_warnings; /* in the images decode_crop returned */

/* ---------------------------------------------------------------- errors ---------------------------------- */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
    int warnings;
} ErrorManager;

static void fail(j_common_ptr cinfo) {
    ErrorManager *err = (ErrorManager *)cinfo->err;
    if (cinfo->err->msg_code == JERR_NO_BACKING_STORE) /* how libjpeg says max_memory_to_use is too little */
        snprintf(err->message, sizeof err->message, "decoding needs more than the memory limit of %ld bytes",
                 cinfo->mem->max_memory_to_use);
    else
        (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

/* A scan can walk every block of the image in a few bytes (an EOB run), so a small progressive file of thousands
   of scans is thousands of passes over a large image: refuse more than nvImageCodec does (256 by default, after
   cure53's audit of libjpeg-turbo). libjpeg calls this monitor once per iMCU row it reads and per row out. */
#define MAX_SCANS 256

static void limit_scans(j_common_ptr cinfo) {
    if (((j_decompress_ptr)cinfo)->input_scan_number <= MAX_SCANS)
        return;
    ErrorManager *err = (ErrorManager *)cinfo->err;
    snprintf(err->message, sizeof err->message, "more than %d scans", MAX_SCANS);
    longjmp(err->jump, 1);
}

/* The warnings after which libjpeg makes up pixels: the data ended or was cut short by a marker (the rest
   decodes as grey), lost a restart interval, or refined coefficients out of order. A read past the last row is
   among them too: jpeg_read_scanlines would return no row, and a loop waiting for one would never end.
   (libjpeg-turbo's advice for untrusted files, in CVE-2019-13960: treat warnings as errors.) A code that no table
   has is not: libjpeg reads it as a zero and goes on through the file's own data, as PIL (and so the MLPerf
   reference) does, and the few such files in datasets are whole pictures (docs/data.md). */
static int makes_up_pixels(int code) {
    switch (code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_MUST_RESYNC:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_TOO_MUCH_DATA:
        return 1;
    default:
        return 0;
    }
}

/* Level -1 is a corrupt-data warning: fatal when the pixels would not be the file's, otherwise counted (libjpeg
   decoded all the data there was: extraneous bytes before a marker, unused scan parameters of a sequential file,
   an unknown JFIF version or Adobe transform, a bad ICC profile). */
static void warn(j_common_ptr cinfo, int level) {
    ErrorManager *err = (ErrorManager *)cinfo->err;
    if (level >= 0)
        return;
    if (makes_up_pixels(cinfo->err->msg_code))
        fail(cinfo);
    err->warnings++;
}

/* --------------------------------------------------------------- resampling ------------------------------- */

/* PIL's antialiased bilinear filter (a triangle widened by the downscale factor) in 14-bit fixed point, applied
   rows first (32 bytes a step) then columns (four outputs a step, four taps at a time), both in AVX2. */
#define WEIGHT_BITS 14
#define GROUP 4 /* horizontal taps per AVX2 step */

typedef struct {
    int outputs;
    int taps;         /* weights per output: the widest window, a multiple of GROUP */
    int *first;       /* first input index of each output's window */
    int *count;       /* the window's length (the weights after it are zero) */
    int16_t *weights; /* `taps` weights per output */
    /* The column plan, in output order (flipped or not), padded to whole steps of four outputs. */
    int padded;
    int *offset;    /* byte offset of each output's window in an RGB row */
    int32_t *lanes; /* per output pair and GROUP of taps, the two madd operands: (w0, w1) x 4 for either output,
                       then (w2, w3) x 4 for either output */
} Filter;

static void filter_free(Filter *f) {
    free(f->first);
    free(f->count);
    free(f->weights);
    free(f->offset);
    free(f->lanes);
    f->first = f->count = f->offset = NULL;
    f->weights = NULL;
    f->lanes = NULL;
}

static void window(double centre, double support, int lo, int hi, int *start, int *stop) {
    *start = (int)(centre - support + 0.5);
    *stop = (int)(centre + support + 0.5);
    if (*start < lo)
        *start = lo;
    if (*stop > hi)
        *stop = hi;
    if (*stop <= *start) /* a box narrower than a pixel: take the nearest input */
        *stop = *start + 1;
}

/* Output i samples inputs [lo, hi) around begin + (i + 0.5) * (end - begin) / outputs. */
static int filter_init(Filter *f, double begin, double end, int lo, int hi, int outputs) {
    double scale = (end - begin) / outputs;
    double widen = scale > 1.0 ? scale : 1.0;
    int start, stop, widest = 1;
    for (int i = 0; i < outputs; i++) {
        window(begin + (i + 0.5) * scale, widen, lo, hi, &start, &stop);
        if (stop - start > widest)
            widest = stop - start;
    }
    f->outputs = outputs;
    f->taps = (widest + GROUP - 1) / GROUP * GROUP;
    f->first = malloc(sizeof(int) * outputs);
    f->count = malloc(sizeof(int) * outputs);
    f->weights = calloc((size_t)outputs * f->taps, sizeof(int16_t));
    if (!f->first || !f->count || !f->weights)
        return -1;
    for (int i = 0; i < outputs; i++) {
        double centre = begin + (i + 0.5) * scale, w[widest], total = 0.0;
        window(centre, widen, lo, hi, &start, &stop);
        for (int k = 0; k < stop - start; k++) {
            double x = fabs((start + k - centre + 0.5) / widen);
            w[k] = x < 1.0 ? 1.0 - x : 0.0;
            total += w[k];
        }
        if (total <= 0.0) {
            w[0] = total = 1.0;
            stop = start + 1;
        }
        /* Weights that sum to exactly 1 << WEIGHT_BITS, so flat areas stay flat. */
        int16_t *q = f->weights + (size_t)i * f->taps;
        int sum = 0, largest = 0;
        for (int k = 0; k < stop - start; k++) {
            q[k] = (int16_t)lround(w[k] / total * (1 << WEIGHT_BITS));
            sum += q[k];
            largest = q[k] > q[largest] ? k : largest;
        }
        q[largest] += (1 << WEIGHT_BITS) - sum;
        f->first[i] = start;
        f->count[i] = stop - start;
    }
    return 0;
}

/* Lay the filter out for resample_columns: output j reads source output j (or n - 1 - j when flipped). */
static int plan_columns(Filter *f, int flip) {
    int n = f->outputs, groups = f->taps / GROUP;
    f->padded = (n + 3) / 4 * 4;
    f->offset = malloc(sizeof(int) * f->padded);
    f->lanes = malloc(sizeof(int32_t) * 16 * (size_t)(f->padded / 2) * groups);
    if (!f->offset || !f->lanes)
        return -1;
    for (int j = 0; j < f->padded; j++) {
        int i = j < n ? (flip ? n - 1 - j : j) : (flip ? 0 : n - 1); /* padding repeats the last output */
        const int16_t *q = f->weights + (size_t)i * f->taps;
        f->offset[j] = 3 * f->first[i];
        for (int g = 0; g < groups; g++) {
            int32_t *v = f->lanes + ((size_t)(j / 2) * groups + g) * 16 + (j % 2) * 4;
            for (int lane = 0; lane < 4; lane++) {
                v[lane] = (int32_t)((uint16_t)q[g * GROUP] | (uint32_t)(uint16_t)q[g * GROUP + 1] << 16);
                v[8 + lane] = (int32_t)((uint16_t)q[g * GROUP + 2] | (uint32_t)(uint16_t)q[g * GROUP + 3] << 16);
            }
        }
    }
    return 0;
}

/* The vertical pass of output row y over bytes [begin, end), 32 a step (rows are padded), with 16-bit rounding
   multiplies: (p << 6) * w >> 15, whose sum (at most 255 << 9) cannot overflow. */
static void resample_rows(const Filter *f, int y, const uint8_t *region, size_t stride, size_t begin, size_t end,
                          uint8_t *dst) {
    const uint8_t *first = region + stride * (size_t)f->first[y];
    const int16_t *w = f->weights + (size_t)y * f->taps;
    const __m256i round = _mm256_set1_epi16(1 << 4);
    for (size_t i = begin; i < end; i += 32) {
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
        for (int t = 0; t < f->count[y]; t++) {
            const __m256i wt = _mm256_set1_epi16(w[t]);
            const uint8_t *p = first + stride * (size_t)t + i;
            __m256i a = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 6);
            __m256i b = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + 16))), 6);
            lo = _mm256_add_epi16(lo, _mm256_mulhrs_epi16(a, wt));
            hi = _mm256_add_epi16(hi, _mm256_mulhrs_epi16(b, wt));
        }
        lo = _mm256_srai_epi16(_mm256_add_epi16(lo, round), 5);
        hi = _mm256_srai_epi16(_mm256_add_epi16(hi, round), 5);
        __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(lo, hi), 0xd8);
        _mm256_storeu_si256((__m256i *)(dst + i), bytes);
    }
}

/* Two outputs (one per 128-bit lane), as 32-bit r g b 0 sums: four taps a step, a madd multiplying two
   neighbouring pixels by two weights per channel. */
static inline __m256i two_outputs(const Filter *f, const uint8_t *src, int j) {
    /* Four RGB pixels (12 of 16 bytes) as r0 r1 g0 g1 b0 b1 0 0 r2 r3 g2 g3 b2 b3 0 0, in each lane. */
    const __m256i pick = _mm256_setr_epi8(0, 3, 1, 4, 2, 5, -1, -1, 6, 9, 7, 10, 8, 11, -1, -1, 0, 3, 1, 4, 2, 5, -1,
                                          -1, 6, 9, 7, 10, 8, 11, -1, -1);
    const __m256i zero = _mm256_setzero_si256();
    const uint8_t *a = src + f->offset[j], *b = src + f->offset[j + 1];
    const __m256i *w = (const __m256i *)(f->lanes + (size_t)(j / 2) * (f->taps / GROUP) * 16);
    __m256i acc = _mm256_set1_epi32(1 << (WEIGHT_BITS - 1)); /* rounding */
    for (int t = 0; t < f->taps; t += GROUP, a += 3 * GROUP, b += 3 * GROUP, w += 2) {
        __m256i px = _mm256_shuffle_epi8(_mm256_loadu2_m128i((const __m128i *)b, (const __m128i *)a), pick);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_unpacklo_epi8(px, zero), _mm256_loadu_si256(w)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_unpackhi_epi8(px, zero), _mm256_loadu_si256(w + 1)));
    }
    return _mm256_srai_epi32(acc, WEIGHT_BITS);
}

/* The horizontal pass of one RGB row into `line` (padded outputs, plus 4 bytes), four outputs a step. Reads up
   to `taps` pixels past a window's start. */
static void resample_columns(const Filter *f, const uint8_t *src, uint8_t *line) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0);
    const __m128i rgb = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    for (int j = 0; j < f->padded; j += 4) {
        /* Outputs j, j + 1 | j + 2, j + 3 pack to bytes j, j + 2 | j + 1, j + 3; order them, drop the zeros. */
        __m256i packed = _mm256_packs_epi32(two_outputs(f, src, j), two_outputs(f, src, j + 2));
        packed = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(packed, packed), order);
        _mm_storeu_si128((__m128i *)(line + 3 * (size_t)j), _mm_shuffle_epi8(_mm256_castsi256_si128(packed), rgb));
    }
}

/* ---------------------------------------------------------------- decoding -------------------------------- */

typedef struct {
    int top, left, height, width;
} Box;

/* Heap buffers of one decode, freed whatever way it ends (pointers volatile: they survive a longjmp). */
typedef struct {
    uint8_t *volatile region;
    uint8_t *volatile rows;
    uint8_t *volatile line;
    Filter vertical, horizontal;
} Buffers;

static void buffers_free(Buffers *b) {
    free(b->region);
    free(b->rows);
    free(b->line);
    filter_free(&b->vertical);
    filter_free(&b->horizontal);
}

/* PIL's conversion of Adobe (inverted) CMYK to RGB, in place: R = C' * K' / 255 with PIL's rounding. */
static void cmyk_to_rgb(uint8_t *pixels, size_t count) {
    for (size_t i = 0; i < count; i++) {
        const uint8_t *in = pixels + 4 * i;
        uint8_t *out = pixels + 3 * i;
        int k = in[3];
        for (int c = 0; c < 3; c++) {
            int v = in[c] * k + 128;
            out[c] = (uint8_t)((v + (v >> 8)) >> 8);
        }
    }
}

static int is_cmyk(const struct jpeg_decompress_struct *cinfo) {
    return cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
}

/* The coarsest DCT scale (n/8, n in 1, 2, 4, 8) that keeps the crop at least as large as the output. */
static int scale_eighths(const Box *crop, int out_h, int out_w) {
    for (int n = 1; n < 8; n *= 2)
        if ((double)crop->height * n / 8 >= out_h && (double)crop->width * n / 8 >= out_w)
            return n;
    return 8;
}

/* A crop edge in scaled pixels: the fractional box [begin, end), the whole pixels it touches [lo, hi), and the
   pixels to decode [from, to): one more each side, because fancy upsampling shifts a cropped decode's edge by a
   pixel (the extra one is decoded and dropped). */
typedef struct {
    double begin, end;
    int lo, hi, from, to;
} Span;

static Span span(int start, int length, double scale, int full) {
    Span s = {start * scale, (start + length) * scale, 0, 0, 0, 0};
    s.lo = (int)floor(s.begin);
    s.hi = (int)ceil(s.end);
    if (s.hi > full)
        s.hi = full;
    if (s.hi <= s.lo)
        s.hi = s.lo + 1;
    s.from = s.lo > 0 ? s.lo - 1 : 0;
    s.to = s.hi < full ? s.hi + 1 : full;
    return s;
}

/* The decoded pixels around a crop: its edges, where the region starts in scaled pixels, and its layout. */
typedef struct {
    Span x, y;
    int x0;
    size_t stride;
} Region;

/* Decode the pixels around `crop`, at the coarsest DCT scale that keeps it at least out_h x out_w, into
   buf->region as RGB; longjmps to the caller's handler on a libjpeg error. */
static int read_region(struct jpeg_decompress_struct *cinfo, Buffers *buf, Box crop, int out_h, int out_w,
                       Region *r) {
    int cmyk = is_cmyk(cinfo);
    cinfo->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    cinfo->scale_num = scale_eighths(&crop, out_h, out_w);
    cinfo->scale_denom = 8;
    jpeg_calc_output_dimensions(cinfo);
    double scale = cinfo->scale_num / 8.0; /* exactly: scaled pixel i covers source pixels [i, i + 1) / scale */
    Span x = span(crop.left, crop.width, scale, (int)cinfo->output_width);
    Span y = span(crop.top, crop.height, scale, (int)cinfo->output_height);

    jpeg_start_decompress(cinfo);
    JDIMENSION xoffset = (JDIMENSION)x.from, width = (JDIMENSION)(x.to - x.from);
    if (width < cinfo->output_width)
        jpeg_crop_scanline(cinfo, &xoffset, &width); /* widens to whole iMCU columns */
    int region_h = y.to - y.from;
    size_t stride = (size_t)width * (cmyk ? 4 : 3);
    buf->region = malloc(stride * region_h + 32); /* the vertical pass reads whole 32-byte steps */
    if (!buf->region)
        return -1;
    if (y.from > 0)
        jpeg_skip_scanlines(cinfo, (JDIMENSION)y.from);
    for (int row = 0; row < region_h;) {
        JSAMPROW dst = buf->region + stride * row;
        row += (int)jpeg_read_scanlines(cinfo, &dst, 1);
    }
    jpeg_abort_decompress(cinfo); /* stop at the crop's bottom edge */
    if (cmyk) {
        cmyk_to_rgb(buf->region, (size_t)width * region_h);
        stride = (size_t)width * 3;
    }
    *r = (Region){x, y, (int)xoffset, stride};
    return 0;
}

/* Resample the crop, in region coordinates, to out_h x out_w: rows first, then columns and the flip. */
static int resample_region(Buffers *buf, const Region *r, int out_h, int out_w, int flip, uint8_t *out) {
    Span x = r->x, y = r->y;
    int x0 = r->x0, y0 = y.from;
    size_t stride = r->stride;
    if (filter_init(&buf->vertical, y.begin - y0, y.end - y0, y.lo - y0, y.hi - y0, out_h) ||
        filter_init(&buf->horizontal, x.begin - x0, x.end - x0, x.lo - x0, x.hi - x0, out_w) ||
        plan_columns(&buf->horizontal, flip))
        return -1;
    size_t n = (stride + 31) / 32 * 32;
    buf->rows = calloc(n + 3 * (size_t)buf->horizontal.taps + 16, 1);
    buf->line = malloc(3 * (size_t)buf->horizontal.padded + 4);
    if (!buf->rows || !buf->line)
        return -1;
    /* Only the columns the horizontal windows read (the region is wider: whole iMCU columns). */
    const Filter *h = &buf->horizontal;
    size_t begin = (size_t)3 * h->first[0] / 32 * 32;
    size_t end = (size_t)3 * (h->first[out_w - 1] + h->taps) + 16;
    end = end < n ? end : n;
    for (int row = 0; row < out_h; row++) {
        resample_rows(&buf->vertical, row, buf->region, stride, begin, end, buf->rows);
        resample_columns(&buf->horizontal, buf->rows, buf->line);
        memcpy(out + (size_t)row * out_w * 3, buf->line, (size_t)out_w * 3);
    }
    return 0;
}

static int decode_into(struct jpeg_decompress_struct *cinfo, Buffers *buf, Box crop, int out_h, int out_w, int flip,
                       uint8_t *out) {
    Region r;
    return read_region(cinfo, buf, crop, out_h, out_w, &r) || resample_region(buf, &r, out_h, out_w, flip, out);
}

/* Huffman-decode every row down to the crop's bottom and nothing more: the floor for a baseline JPEG.
   (Skipping to the last row is free in libjpeg-turbo, so a crop that reaches it reads that row, one column.) */
static void entropy_only(struct jpeg_decompress_struct *cinfo, Box crop) {
    cinfo->out_color_space = is_cmyk(cinfo) ? JCS_CMYK : JCS_RGB;
    jpeg_start_decompress(cinfo);
    JDIMENSION xoffset = 0, width = 1, bottom = (JDIMENSION)(crop.top + crop.height);
    jpeg_crop_scanline(cinfo, &xoffset, &width);
    if (bottom < cinfo->output_height) {
        jpeg_skip_scanlines(cinfo, bottom);
    } else {
        JSAMPLE pixels[4 * 64];
        JSAMPROW row = pixels;
        if (bottom > 1)
            jpeg_skip_scanlines(cinfo, bottom - 1);
        jpeg_read_scanlines(cinfo, &row, 1);
    }
    jpeg_abort_decompress(cinfo);
}

/* ---------------------------------------------------------------- one call --------------------------------- */

enum Status { OK, REFUSED, NO_MEMORY }; /* REFUSED: a DecodeError, with the job's message */
enum Work { HEADER, DECODE, PIXELS, ENTROPY };

/* Everything one call reads and writes; plain C, so it runs with the GIL released. */
typedef struct {
    const uint8_t *data;
    size_t size;
    long long max_pixels;
    int has_crop;
    Box crop;
    int out_h, out_w, flip;
    uint8_t *out;
    int height, width; /* read from the header */
    int warnings;
    char message[JMSG_LENGTH_MAX];
} Job;

/* A decompression bomb (a small file whose header claims a huge image) is refused before libjpeg allocates. */
static enum Status check_size(Job *job) {
    long long pixels = (long long)job->height * job->width;
    if (pixels <= job->max_pixels)
        return OK;
    snprintf(job->message, sizeof job->message, "%dx%d image (%lld pixels) is over the limit of %lld pixels",
             job->height, job->width, pixels, job->max_pixels);
    return REFUSED;
}

/* Written as `top > height - h` (h >= 1, so no overflow): `top + h > height` wraps for a top near INT_MAX. */
static enum Status check_crop(Job *job) {
    Box *b = &job->crop;
    if (!job->has_crop) {
        *b = (Box){0, 0, job->height, job->width};
        return OK;
    }
    if (b->top < 0 || b->left < 0 || b->height < 1 || b->width < 1 || b->top > job->height - b->height ||
        b->left > job->width - b->width) {
        snprintf(job->message, sizeof job->message, "crop (%d, %d, %d, %d) is not inside the %dx%d image", b->top,
                 b->left, b->height, b->width, job->height, job->width);
        return REFUSED;
    }
    return OK;
}

/* libjpeg's own cap, a backstop to check_size: what the whole-image coefficient buffer of a progressive (or
   multi-scan) image at the pixel limit takes, 2 bytes a pixel for each of at most 4 full-size components, plus
   room for its other tables. Over it, jpeg_start_decompress refuses before allocating (no backing store). */
#define COEFFICIENT_BYTES_PER_PIXEL 8
#define MEMORY_SLACK (64L << 20)

static long memory_cap(long long max_pixels) {
    if (max_pixels > (LONG_MAX - MEMORY_SLACK) / COEFFICIENT_BYTES_PER_PIXEL)
        return LONG_MAX;
    return max_pixels > 0 ? (long)max_pixels * COEFFICIENT_BYTES_PER_PIXEL + MEMORY_SLACK : MEMORY_SLACK;
}

static enum Status run(Job *job, enum Work work) {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    struct jpeg_progress_mgr progress = {.progress_monitor = limit_scans};
    Buffers buf;
    memset(&buf, 0, sizeof buf);
    volatile enum Status status = OK;
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = fail;
    err.pub.emit_message = warn;
    err.warnings = 0;
    if (setjmp(err.jump)) {
        memcpy(job->message, err.message, sizeof job->message);
        status = REFUSED;
    } else {
        jpeg_create_decompress(&cinfo);
        cinfo.mem->max_memory_to_use = memory_cap(job->max_pixels);
        cinfo.progress = &progress;
        jpeg_mem_src(&cinfo, job->data, (unsigned long)job->size);
        jpeg_read_header(&cinfo, TRUE);
        job->height = (int)cinfo.image_height;
        job->width = (int)cinfo.image_width;
        status = check_size(job);
        if (status == OK && work != HEADER)
            status = check_crop(job);
        if (status == OK && work == DECODE &&
            decode_into(&cinfo, &buf, job->crop, job->out_h, job->out_w, job->flip, job->out))
            status = NO_MEMORY;
        Region region;
        if (status == OK && work == PIXELS && read_region(&cinfo, &buf, job->crop, job->out_h, job->out_w, &region))
            status = NO_MEMORY;
        if (status == OK && work == ENTROPY)
            entropy_only(&cinfo, job->crop);
    }
    job->warnings = err.warnings;
    jpeg_destroy_decompress(&cinfo);
    buffers_free(&buf);
    return status;
}

/* ---------------------------------------------------------------- Python face ----------------------------- */

/* The exception for a call that did not succeed; returns NULL. */
static PyObject *raise_for(const Job *job, enum Status status) {
    switch (status) {
    case OK:
        break;
    case REFUSED:
        PyErr_SetString(DecodeError, job->message);
        break;
    case NO_MEMORY:
        PyErr_NoMemory();
        break;
    }
    return NULL;
}

static int parse_crop(PyObject *obj, Job *job) {
    job->has_crop = obj != Py_None;
    if (!job->has_crop)
        return 0;
    Box *b = &job->crop;
    return PyArg_ParseTuple(obj, "iiii;crop must be (top, left, height, width)", &b->top, &b->left, &b->height,
                            &b->width)
               ? 0
               : -1;
}

static enum Status run_unlocked(Job *job, enum Work work) {
    enum Status status;
    Py_BEGIN_ALLOW_THREADS;
    status = run(job, work);
    Py_END_ALLOW_THREADS;
    return status;
}

PyDoc_STRVAR(image_size_doc, "image_size(data, max_pixels) -> (height, width), from the JPEG header alone.");

static PyObject *py_image_size(PyObject *self, PyObject *args) {
    Py_buffer data;
    Job job = {0};
    if (!PyArg_ParseTuple(args, "y*L", &data, &job.max_pixels))
        return NULL;
    job.data = data.buf;
    job.size = (size_t)data.len;
    enum Status status = run(&job, HEADER);
    PyBuffer_Release(&data);
    return status == OK ? Py_BuildValue("(ii)", job.height, job.width) : raise_for(&job, status);
}

PyDoc_STRVAR(decode_crop_doc,
             "decode_crop(data, max_pixels, crop, (out_h, out_w), flip, out) -> None\n\n"
             "Decode crop = (top, left, height, width) or None of a JPEG of at most max_pixels pixels, resized to\n"
             "out_h x out_w RGB, into the writable buffer `out` of out_h * out_w * 3 bytes.");

static PyObject *py_decode_crop(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    PyObject *crop;
    Job job = {0};
    if (!PyArg_ParseTuple(args, "y*LO(ii)pw*", &data, &job.max_pixels, &crop, &job.out_h, &job.out_w, &job.flip,
                          &out))
        return NULL;
    PyObject *result = NULL;
    if (job.out_h < 1 || job.out_w < 1 || out.len != (Py_ssize_t)job.out_h * job.out_w * 3) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes, not %d x %d x 3", out.len, job.out_h, job.out_w);
    } else if (parse_crop(crop, &job) == 0) {
        job.data = data.buf;
        job.size = (size_t)data.len;
        job.out = out.buf;
        enum Status status = run_unlocked(&job, DECODE);
        if (status == OK)
            corrupt_warnings += (unsigned long long)job.warnings;
        result = status == OK ? Py_NewRef(Py_None) : raise_for(&job, status);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&data);
    return result;
}

/* The benchmark instruments: one part of a decode, run on its own and thrown away. */
static PyObject *instrument(PyObject *args, enum Work work) {
    Py_buffer data;
    PyObject *crop;
    Job job = {.out_h = 1, .out_w = 1};
    if (!PyArg_ParseTuple(args, "y*LO|(ii)", &data, &job.max_pixels, &crop, &job.out_h, &job.out_w))
        return NULL;
    PyObject *result = NULL;
    if (parse_crop(crop, &job) == 0) {
        job.data = data.buf;
        job.size = (size_t)data.len;
        enum Status status = run_unlocked(&job, work);
        result = status == OK ? Py_NewRef(Py_None) : raise_for(&job, status);
    }
    PyBuffer_Release(&data);
    return result;
}

PyDoc_STRVAR(entropy_decode_doc,
             "entropy_decode(data, max_pixels, crop) -> None\n\n"
             "Huffman-decode the rows down to the crop's bottom and produce nothing: the decode floor.");

static PyObject *py_entropy_decode(PyObject *self, PyObject *args) { return instrument(args, ENTROPY); }

PyDoc_STRVAR(pixel_decode_doc,
             "pixel_decode(data, max_pixels, crop, (out_h, out_w)) -> None\n\n"
             "libjpeg's part of decode_crop: the crop's pixels decoded to RGB at the same DCT scale, not resized.");

static PyObject *py_pixel_decode(PyObject *self, PyObject *args) { return instrument(args, PIXELS); }

PyDoc_STRVAR(corrupt_warnings_doc,
             "corrupt_warnings() -> int: corrupt-data warnings libjpeg recovered from in the images decode_crop\n"
             "returned in this process (the warnings that would change pixels are errors).");

static PyObject *py_corrupt_warnings(PyObject *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(corrupt_warnings);
}

static PyMethodDef methods[] = {
    {"image_size", py_image_size, METH_VARARGS, image_size_doc},
    {"decode_crop", py_decode_crop, METH_VARARGS, decode_crop_doc},
    {"entropy_decode", py_entropy_decode, METH_VARARGS, entropy_decode_doc},
    {"pixel_decode", py_pixel_decode, METH_VARARGS, pixel_decode_doc},
    {"corrupt_warnings", py_corrupt_warnings, METH_NOARGS, corrupt_warnings_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg", "Fused JPEG decode-and-crop over libjpeg.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__jpeg(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    DecodeError = PyErr_NewExceptionWithDoc("data.jpeg.DecodeError", "Bytes that are not a decodable JPEG.",
                                            PyExc_ValueError, NULL);
    if (PyModule_AddObjectRef(m, "DecodeError", DecodeError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
