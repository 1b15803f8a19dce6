/* bigbatch.data._jpeg_region: decode only a crop's region of a JPEG, with the system's libjpeg-turbo.
 *
 * A training crop keeps a part of the image (Inception's crop, at least 5 % of it and often much less). libjpeg-turbo
 * can leave out the columns outside a region (jpeg_crop_scanline) and the inverse DCT and colour conversion of the
 * rows above it (jpeg_skip_scanlines), as TensorFlow's decode_and_crop_jpeg does. The pixels are those of the whole
 * decode, bit for bit, for the layouts header() accepts: libjpeg-turbo decodes each kept row the same way, and one
 * column of context is kept on each side of the crop, since the fancy (triangle-filter) chroma upsampling reads its
 * neighbours and would otherwise replicate the region's edge. tests/data/test_jpeg_region.py checks this against
 * torchvision's decode_jpeg on 4:4:4, 4:2:2, 4:2:0, greyscale, progressive and restart-marker files, crops at every
 * edge.
 *
 * The rows below the crop are not read. A file cut short fails whatever the crop ("Image is incomplete or
 * truncated", as torchvision's whole decode fails on it): it has no end-of-image marker after its first scan's start.
 *
 * Python API (the GIL is released while libjpeg runs):
 *   header(buffer) -> (height, width, region)   region: whether decode() gives the whole decode's pixels for it
 *   decode(buffer, top, left, height, width, reduction) -> bytearray of height x width x 3 RGB bytes, rows of the
 *       image scaled by 1/reduction (1, 2, 4 or 8: libjpeg's DCT scaling, each side ceil(side / reduction))
 * Errors are ValueError with libjpeg's message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} Errors;

static void fail(j_common_ptr c) {
    Errors *errors = (Errors *)c->err;
    (*c->err->format_message)(c, errors->message);
    longjmp(errors->jump, 1);
}

static void ignore_warning(j_common_ptr c, int level) {
    /* Corrupt-data warnings (level -1): libjpeg goes on with what it can decode, as in torchvision's decode; the
     * file is not reported, and nothing is printed from a data worker. */
    (void)c;
    (void)level;
}

/* The encoded bytes as one buffer; running out of them is an error (libjpeg's jpeg_mem_src would instead warn and
 * decode the rest as grey). */
static void source_init(j_decompress_ptr c) { (void)c; }

static boolean source_fill(j_decompress_ptr c) {
    Errors *errors = (Errors *)c->err;
    snprintf(errors->message, sizeof errors->message, "Image is incomplete or truncated");
    longjmp(errors->jump, 1);
    return FALSE;
}

static void source_skip(j_decompress_ptr c, long count) {
    struct jpeg_source_mgr *source = c->src;
    if (count <= 0) return;
    if ((size_t)count > source->bytes_in_buffer) source_fill(c);
    source->next_input_byte += count;
    source->bytes_in_buffer -= (size_t)count;
}

static void source_term(j_decompress_ptr c) { (void)c; }

static void open_decoder(j_decompress_ptr c, Errors *errors, struct jpeg_source_mgr *source, const void *data,
                         size_t size) {
    c->err = jpeg_std_error(&errors->pub);
    errors->pub.error_exit = fail;
    errors->pub.emit_message = ignore_warning;
    errors->message[0] = '\0';
    jpeg_create_decompress(c);
    source->init_source = source_init;
    source->fill_input_buffer = source_fill;
    source->skip_input_data = source_skip;
    source->resync_to_restart = jpeg_resync_to_restart;
    source->term_source = source_term;
    source->next_input_byte = (const JOCTET *)data;
    source->bytes_in_buffer = size;
    c->src = source;
}

/* Whether the region decode is the whole decode's pixels: greyscale, or YCbCr with 4:4:4, 4:2:2 or 4:2:0 chroma
 * (the layouts the tests check). CMYK, YCCK, RGB-coded, 4:4:0 and 4:1:1 files are decoded whole by the caller. */
static int region_supported(const struct jpeg_decompress_struct *c) {
    if (c->jpeg_color_space == JCS_GRAYSCALE && c->num_components == 1) return 1;
    if (c->jpeg_color_space != JCS_YCbCr || c->num_components != 3) return 0;
    const jpeg_component_info *y = &c->comp_info[0];
    for (int i = 1; i < 3; i++)
        if (c->comp_info[i].h_samp_factor != 1 || c->comp_info[i].v_samp_factor != 1) return 0;
    return (y->h_samp_factor == 1 && y->v_samp_factor == 1) || (y->h_samp_factor == 2 && y->v_samp_factor == 1) ||
           (y->h_samp_factor == 2 && y->v_samp_factor == 2);
}

static PyObject *header(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buffer;
    if (!PyArg_ParseTuple(args, "y*", &buffer)) return NULL;
    struct jpeg_decompress_struct c;
    Errors errors;
    struct jpeg_source_mgr source;
    int ok = 1, supported = 0;
    JDIMENSION height = 0, width = 0;
    Py_BEGIN_ALLOW_THREADS
    if (setjmp(errors.jump)) {
        ok = 0;
    } else {
        open_decoder(&c, &errors, &source, buffer.buf, (size_t)buffer.len);
        jpeg_read_header(&c, TRUE);
        height = c.image_height;
        width = c.image_width;
        supported = region_supported(&c);
    }
    jpeg_destroy_decompress(&c);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buffer);
    if (!ok) return PyErr_Format(PyExc_ValueError, "%s", errors.message);
    return Py_BuildValue("(IIO)", height, width, supported ? Py_True : Py_False);
}

/* Whether an end-of-image marker (FF D9) lies in the bytes. Entropy-coded data cannot hold one (a data byte FF is
 * followed by 00), so after the first start of scan it is the image's end. Searched from the end: a file's last
 * two bytes, unless something follows its image. */
static int has_end_marker(const JOCTET *bytes, size_t count) {
    for (size_t i = count; i >= 2; i--)
        if (bytes[i - 2] == 0xFF && bytes[i - 1] == 0xD9) return 1;
    return 0;
}

/* Decode rows [top, top + height) and columns [left, left + width) of the image at 1/reduction into out
 * (height x width x 3). Returns 0, or -1 with errors->message set. */
static int decode_region(const void *data, size_t size, JDIMENSION top, JDIMENSION left, JDIMENSION height,
                         JDIMENSION width, int reduction, unsigned char *out, Errors *errors) {
    struct jpeg_decompress_struct c;
    struct jpeg_source_mgr source;
    unsigned char *volatile row = NULL;
    if (setjmp(errors->jump)) {
        free(row);
        jpeg_destroy_decompress(&c);
        return -1;
    }
    open_decoder(&c, errors, &source, data, size);
    jpeg_read_header(&c, TRUE);
    const JOCTET *scan = source.next_input_byte;  /* the first scan's data starts here */
    if (!region_supported(&c)) {
        snprintf(errors->message, sizeof errors->message, "a JPEG layout the region decode does not take");
        longjmp(errors->jump, 1);
    }
    c.out_color_space = JCS_RGB;
    c.scale_num = 1;
    c.scale_denom = (unsigned int)reduction;
    jpeg_start_decompress(&c);
    if (height == 0 || width == 0 || top >= c.output_height || height > c.output_height - top ||
        left >= c.output_width || width > c.output_width - left) {
        snprintf(errors->message, sizeof errors->message,
                 "the region %u x %u at (%u, %u) is not inside the %u x %u image", height, width, top, left,
                 c.output_height, c.output_width);
        longjmp(errors->jump, 1);
    }
    /* One column of context on each side where the image has it; libjpeg widens the region to whole iMCUs. */
    JDIMENSION before = left > 0, after = left + width < c.output_width;
    JDIMENSION first = left - before, count = width + before + after;
    jpeg_crop_scanline(&c, &first, &count);
    row = malloc((size_t)count * 3);
    if (row == NULL) {
        snprintf(errors->message, sizeof errors->message, "out of memory for a row of %u pixels", count);
        longjmp(errors->jump, 1);
    }
    if (top > 0) jpeg_skip_scanlines(&c, top);
    JSAMPROW rows[1] = {row};
    for (JDIMENSION i = 0; i < height; i++) {
        if (jpeg_read_scanlines(&c, rows, 1) != 1) {
            snprintf(errors->message, sizeof errors->message, "Image is incomplete or truncated");
            longjmp(errors->jump, 1);
        }
        memcpy(out + (size_t)i * width * 3, row + (size_t)(left - first) * 3, (size_t)width * 3);
    }
    /* The rows below the crop are left unread (skipping to the end reads nothing: a third of the whole decode's
     * time is the entropy decoding). A file cut short still fails, as the whole decode fails on it: it has no
     * end-of-image marker after its first scan's start. */
    JDIMENSION rest = c.output_height - c.output_scanline;
    if (rest > 0) jpeg_skip_scanlines(&c, rest);
    if (!has_end_marker(scan, (size_t)((const JOCTET *)data + size - scan))) {
        snprintf(errors->message, sizeof errors->message, "Image is incomplete or truncated");
        longjmp(errors->jump, 1);
    }
    jpeg_finish_decompress(&c);
    jpeg_destroy_decompress(&c);
    free(row);
    return 0;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buffer;
    unsigned int top, left, height, width;
    int reduction;
    if (!PyArg_ParseTuple(args, "y*IIIIi", &buffer, &top, &left, &height, &width, &reduction)) return NULL;
    if (reduction != 1 && reduction != 2 && reduction != 4 && reduction != 8) {
        PyBuffer_Release(&buffer);
        return PyErr_Format(PyExc_ValueError, "reduction %d is not 1, 2, 4 or 8", reduction);
    }
    /* A JPEG's sides are at most 65535; the pixels at most 2^28 (PIL refuses about 179 million as a bomb). */
    if (height == 0 || width == 0 || height > 65535 || width > 65535 || (size_t)height * width > ((size_t)1 << 28)) {
        PyBuffer_Release(&buffer);
        return PyErr_Format(PyExc_ValueError, "the region %u x %u is not inside a JPEG", height, width);
    }
    PyObject *pixels = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)height * width * 3);
    if (pixels == NULL) {
        PyBuffer_Release(&buffer);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(pixels);
    Errors errors;
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = decode_region(buffer.buf, (size_t)buffer.len, top, left, height, width, reduction, out, &errors);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buffer);
    if (result != 0) {
        Py_DECREF(pixels);
        return PyErr_Format(PyExc_ValueError, "%s", errors.message);
    }
    return pixels;
}

static PyMethodDef methods[] = {
    {"header", header, METH_VARARGS, "header(buffer) -> (height, width, region): the JPEG's size, and whether "
                                     "decode() gives its whole decode's pixels"},
    {"decode", decode, METH_VARARGS, "decode(buffer, top, left, height, width, reduction) -> bytearray: the "
                                     "region's RGB rows (height x width x 3) of the image at 1/reduction"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_region",
                                    "Decode a crop's region of a JPEG with libjpeg-turbo (csrc/jpeg_region.c).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__jpeg_region(void) { return PyModule_Create(&module); }
