/* How long libjpeg-turbo takes to decode only a crop's region of a JPEG (jpeg_crop_scanline and
 * jpeg_skip_scanlines, as TensorFlow's decode_and_crop_jpeg), against decoding the whole image: the bound on what
 * a region-of-interest decode could save in bigbatch's input pipeline. Built and run by
 * benchmarks/roi_decode_bound.py, which gives it the crop boxes on stdin, one "path top left height width" a line;
 * it prints "full_ms roi_ms identical" (the mean per image over the list, best of the rounds; identical: 1 when every
 * region decode equals the same pixels of the whole decode). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jpeglib.h>

#define MAX_IMAGES 4096
#define MAX_BYTES (64L << 20)

typedef struct { unsigned char *data; long size; int top, left, height, width; } Sample;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Decode RGB rows [top, top + height) and columns [left, left + width) into out (height x width x 3); the whole
 * image when crop is 0. Returns the number of columns libjpeg decoded per row (its region is widened to whole
 * iMCUs) and their first column in *first. */
static JDIMENSION decode(const Sample *s, int crop, unsigned char *rows, unsigned char *out, JDIMENSION *first) {
    struct jpeg_decompress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_decompress(&c);
    jpeg_mem_src(&c, s->data, (unsigned long)s->size);
    jpeg_read_header(&c, TRUE);
    c.out_color_space = JCS_RGB;
    jpeg_start_decompress(&c);
    /* One column more than the crop on each side where the image has it: libjpeg's fancy (chroma) upsampling
     * replicates a region's first and last columns instead of reading their neighbours, so those columns would
     * differ from the whole decode. (jpeg_crop_scanline then widens the region to whole iMCUs.) */
    JDIMENSION before = s->left > 0, after = (JDIMENSION)(s->left + s->width) < c.output_width;
    JDIMENSION x = crop ? (JDIMENSION)s->left - before : 0;
    JDIMENSION w = crop ? (JDIMENSION)s->width + before + after : c.output_width;
    if (crop) {
        jpeg_crop_scanline(&c, &x, &w);
        if (s->top > 0) jpeg_skip_scanlines(&c, (JDIMENSION)s->top);
    }
    JDIMENSION count = crop ? (JDIMENSION)s->height : c.output_height;
    for (JDIMENSION i = 0; i < count; i++) {
        JSAMPROW row = rows + (size_t)i * w * 3;
        jpeg_read_scanlines(&c, &row, 1);
    }
    if (c.output_scanline < c.output_height) jpeg_skip_scanlines(&c, c.output_height - c.output_scanline);
    jpeg_finish_decompress(&c);
    jpeg_destroy_decompress(&c);
    if (out) { /* the crop's own columns */
        JDIMENSION from = crop ? (JDIMENSION)s->left - x : (JDIMENSION)s->left;
        for (int i = 0; i < s->height; i++) {
            size_t row = crop ? (size_t)i : (size_t)(i + s->top);
            memcpy(out + (size_t)i * s->width * 3, rows + (row * w + from) * 3, (size_t)s->width * 3);
        }
    }
    *first = x;
    return w;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    static Sample samples[MAX_IMAGES];
    int n = 0;
    char path[4096];
    int top, left, height, width;
    while (n < MAX_IMAGES && scanf("%4095s %d %d %d %d", path, &top, &left, &height, &width) == 5) {
        FILE *f = fopen(path, "rb");
        if (!f) { fprintf(stderr, "cannot open %s\n", path); return 2; }
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        rewind(f);
        if (size <= 0 || size > MAX_BYTES) { fprintf(stderr, "%s: size %ld out of range\n", path, size); return 2; }
        samples[n].data = malloc((size_t)size);
        if (fread(samples[n].data, 1, (size_t)size, f) != (size_t)size) { fprintf(stderr, "short read\n"); return 2; }
        fclose(f);
        samples[n] = (Sample){samples[n].data, size, top, left, height, width};
        n++;
    }
    if (n == 0) { fprintf(stderr, "no samples on stdin\n"); return 2; }
    unsigned char *rows = malloc(8192L * 8192 * 3), *a = malloc(8192L * 8192 * 3), *b = malloc(8192L * 8192 * 3);
    int identical = 1;
    JDIMENSION first;
    for (int i = 0; i < n; i++) {
        decode(&samples[i], 0, rows, a, &first);
        decode(&samples[i], 1, rows, b, &first);
        identical &= memcmp(a, b, (size_t)samples[i].height * samples[i].width * 3) == 0;
    }
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < rounds; r++) {
        for (int crop = 0; crop < 2; crop++) {
            double start = now();
            for (int i = 0; i < n; i++) decode(&samples[i], crop, rows, NULL, &first);
            double per = (now() - start) / n * 1e3;
            if (per < best[crop]) best[crop] = per;
        }
    }
    printf("%.4f %.4f %d\n", best[0], best[1], identical);
    return 0;
}
