/* bigbatch.data._hsv: Darknet's HSV distortion of one RGB image in one pass, the same floats as distort_hsv's torch ops.
 *
 * bigbatch/data/transforms/det_transforms.py distort_hsv() has the formula (rgb_to_hsv, the saturation times
 * `saturation` clipped to 1, the hue shifted by `hue` turns and wrapped, hsv_to_rgb's closed form, times `exposure`,
 * clipped to [0, 1]). It takes about twenty torch operations, each a pass over the image and a dispatch; at a
 * detector's 128-416 px the dispatches are most of its time. This file computes every pixel with the same float32
 * operations in the same order (no fused multiply-add: built with -ffp-contract=off), so its output equals the torch
 * version's bit for bit (tests/data/test_hsv_kernel.py checks it on random and on grey, black and saturated pixels).
 *
 * torch.remainder(x, 6) is fmod(x, 6), plus 6 where that is negative. With |hue| <= 0.5 the shifted hue lies in
 * [-4, 8] and each channel's k in [1, 12], where fmod(x, 6) is x or x - 6, both exact (x - 6 by Sterbenz's lemma for
 * x in [3, 12]); so the loop has no call and no branch the compiler cannot turn into a select. Larger hues are the
 * caller's to send to the torch version.
 *
 * Python API (the GIL is released while it runs):
 *   distort(pixels, out, is_uint8, height, width, hue, saturation, exposure) -> None
 *       pixels: a C-contiguous (3, height, width) buffer of float32 in [0, 1], or of uint8 (is_uint8), which is first
 *       made float32 as torchvision's to_dtype(scale=True) does: (float)u * (float)(1 / 255.0); out: a writable
 *       C-contiguous buffer of 3 x height x width float32 (the caller's tensor: a new bytearray of that size costs
 *       more than the distortion, its pages faulted in afresh each time).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <stdint.h>
#include <string.h>

static inline float clamp01(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

/* torch.remainder(x, 6) for x in [-6, 12) */
static inline float wrap6(float x) {
    float m = x >= 6.0f ? x - 6.0f : x;
    return m < 0.0f ? m + 6.0f : m;
}

/* One pixel, written with selects only, so that the loops below vectorize. */
typedef struct {
    float r, g, b;
} Pixel;

static inline Pixel distort_pixel(float r, float g, float b, float shift, float sat, float expo) {
    const float tiny = FLT_MIN; /* torch.finfo(float32).tiny */
    /* the maximum over the channels, and which one holds it first, as torch.max(dim) gives the index */
    const float v_rg = g > r ? g : r;
    const float v = b > v_rg ? b : v_rg;
    const float low_rg = r < g ? r : g;
    const float low = b < low_rg ? b : low_rg;
    const float span = v - low;
    const float safe = span > tiny ? span : tiny;
    const float from_r = (g - b) / safe, from_g = (b - r) / safe + 2.0f, from_b = (r - g) / safe + 4.0f;
    const float from_rg = g > r ? from_g : from_r;
    const float sixths = wrap6((b > v_rg ? from_b : from_rg) + shift);
    const float v_safe = v > tiny ? v : tiny;
    const float scaled = clamp01(span / v_safe * sat);
    const float value = v * expo;
    const float k_r = wrap6(5.0f + sixths), k_g = wrap6(3.0f + sixths), k_b = wrap6(1.0f + sixths);
    const float w_r = clamp01(k_r < 4.0f - k_r ? k_r : 4.0f - k_r);
    const float w_g = clamp01(k_g < 4.0f - k_g ? k_g : 4.0f - k_g);
    const float w_b = clamp01(k_b < 4.0f - k_b ? k_b : 4.0f - k_b);
    return (Pixel){clamp01(value * (1.0f - scaled * w_r)), clamp01(value * (1.0f - scaled * w_g)),
                   clamp01(value * (1.0f - scaled * w_b))};
}

static void distort_float(const float *restrict in, float *restrict out, Py_ssize_t n, double hue, double saturation,
                          double exposure) {
    const float shift = (float)(6.0 * hue), sat = (float)saturation, expo = (float)exposure;
    if (hue == 0.0 && saturation == 1.0) { /* distort_hsv's shortcut: (image * exposure).clamp(0, 1) */
        for (Py_ssize_t i = 0; i < 3 * n; i++) out[i] = clamp01(in[i] * expo);
        return;
    }
    const float *restrict r = in, *restrict g = in + n, *restrict b = in + 2 * n;
    float *restrict out_r = out, *restrict out_g = out + n, *restrict out_b = out + 2 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Pixel p = distort_pixel(r[i], g[i], b[i], shift, sat, expo);
        out_r[i] = p.r;
        out_g[i] = p.g;
        out_b[i] = p.b;
    }
}

/* uint8 first made float32 as torchvision's to_dtype(scale=True) does: (float)u * (float)(1 / 255.0) */
static void distort_uint8(const uint8_t *restrict in, float *restrict out, Py_ssize_t n, double hue,
                          double saturation, double exposure) {
    const float to_unit = (float)(1.0 / 255.0);
    const float shift = (float)(6.0 * hue), sat = (float)saturation, expo = (float)exposure;
    if (hue == 0.0 && saturation == 1.0) {
        for (Py_ssize_t i = 0; i < 3 * n; i++) out[i] = clamp01(((float)in[i] * to_unit) * expo);
        return;
    }
    const uint8_t *restrict r = in, *restrict g = in + n, *restrict b = in + 2 * n;
    float *restrict out_r = out, *restrict out_g = out + n, *restrict out_b = out + 2 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Pixel p = distort_pixel((float)r[i] * to_unit, (float)g[i] * to_unit, (float)b[i] * to_unit, shift, sat,
                                      expo);
        out_r[i] = p.r;
        out_g[i] = p.g;
        out_b[i] = p.b;
    }
}

static PyObject *distort(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buffer, target;
    int is_uint8;
    Py_ssize_t height, width;
    double hue, saturation, exposure;
    if (!PyArg_ParseTuple(args, "y*w*pnnddd", &buffer, &target, &is_uint8, &height, &width, &hue, &saturation,
                          &exposure))
        return NULL;
    PyObject *result = NULL;
    if (height < 0 || width < 0 || (width > 0 && height > PY_SSIZE_T_MAX / 16 / width)) {
        PyErr_SetString(PyExc_ValueError, "bad image size");
        goto done;
    }
    const Py_ssize_t n = height * width;
    if (buffer.len != 3 * n * (is_uint8 ? 1 : (Py_ssize_t)sizeof(float))) {
        PyErr_Format(PyExc_ValueError, "the buffer holds %zd bytes, not 3 x %zd x %zd %s", buffer.len, height, width,
                     is_uint8 ? "uint8" : "float32");
        goto done;
    }
    if (!(hue >= -0.5 && hue <= 0.5)) {
        PyErr_SetString(PyExc_ValueError, "hue must lie in [-0.5, 0.5] turns");
        goto done;
    }
    if (target.len != 3 * n * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "the output holds %zd bytes, not 3 x %zd x %zd float32", target.len, height,
                     width);
        goto done;
    }
    float *out = (float *)target.buf;
    Py_BEGIN_ALLOW_THREADS
    if (is_uint8)
        distort_uint8((const uint8_t *)buffer.buf, out, n, hue, saturation, exposure);
    else
        distort_float((const float *)buffer.buf, out, n, hue, saturation, exposure);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&buffer);
    PyBuffer_Release(&target);
    return result;
}

static PyMethodDef methods[] = {
    {"distort", distort, METH_VARARGS, "Darknet's HSV distortion of a (3, H, W) float32 or uint8 buffer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hsv", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__hsv(void) { return PyModule_Create(&module); }
