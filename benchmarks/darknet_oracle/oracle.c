/*
 * Darknet oracle: parse a .cfg with Darknet's own library (AlexeyAB or
 * pjreddie fork), fill every saved tensor by the FILL RULE, save the
 * .weights, check the file against the rule, fill the input by the INPUT
 * RULE, run network_predict (inference) and dump per-layer output stats.
 *
 * Only Darknet's library API is called; no Darknet code is copied here.
 *
 * Usage: oracle CFG OUTDIR [--shapes]
 *   --shapes: parse only and write OUTDIR/shapes.txt ("i type out_w out_h out_c")
 * Writes OUTDIR/net.weights, OUTDIR/meta.txt (after save), OUTDIR/layers.txt
 * (after predict) and OUTDIR/segments.txt (start count role fan_in per saved
 * tensor, for an independent read-back check).  Build with build.sh (-DALEXEYAB for the AlexeyAB fork).
 *
 * layers.txt: one line per layer, whitespace separated:
 *   i type out_w out_h out_c outputs bn mean std max_abs nonfinite s0..s7
 * (bn: l.batch_normalize for convolutional/connected layers, -1 otherwise;
 *  floats printed with %.9g, i.e. float32 round-trip; mean/std with %.17g)
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include "darknet.h"

#ifdef ALEXEYAB
network parse_network_cfg_custom(char *filename, int batch, int time_steps);
void save_weights(network net, char *filename);
#endif
char *get_layer_string(LAYER_TYPE a);

/* ---------------- rules ---------------- */
static uint32_t hash32(uint32_t x)
{
    x ^= x >> 16; x *= 0x7feb352du;
    x ^= x >> 15; x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
static float u_of(uint32_t k)
{
    return (float)(hash32(k) >> 8) * (1.0f / 16777216.0f);
}

enum { R_BIAS, R_SCALE, R_MEAN, R_VAR, R_WEIGHT, R_OTHER };
static const char *role_name[] = {"biases", "scales", "rolling_mean",
                                  "rolling_variance", "weights", "other"};

static float rule_value(uint32_t k, int role, float fan_in)
{
    float u = u_of(k);
    switch (role) {
    case R_BIAS: return 0.2f * (u - 0.5f);
    case R_SCALE: return 0.8f + 0.4f * u;
    case R_MEAN: return 0.2f * (u - 0.5f);
    case R_VAR: return 0.5f + u;
    case R_WEIGHT: return (2.0f * u - 1.0f) * sqrtf(3.0f / fan_in);
    default: return 0.2f * (u - 0.5f);
    }
}

/* segments of the stream, kept for the read-back check */
typedef struct { uint64_t start, count; int role; float fan_in; } segment;
static segment *segs = NULL;
static int nsegs = 0, capsegs = 0;
static uint64_t kpos = 0;   /* stream index of the next value */
static int n_other = 0;

static void fill(float *a, long n, int role, float fan_in, int layer_index, const char *what)
{
    long j;
    if (n <= 0) return;
    if (!a) { fprintf(stderr, "oracle: NULL array %s of layer %d\n", what, layer_index); exit(3); }
    for (j = 0; j < n; ++j) a[j] = rule_value((uint32_t)(kpos + j), role, fan_in);
    if (nsegs == capsegs) {
        capsegs = capsegs ? 2 * capsegs : 256;
        segs = (segment *)realloc(segs, capsegs * sizeof(segment));
    }
    segs[nsegs].start = kpos; segs[nsegs].count = n;
    segs[nsegs].role = role; segs[nsegs].fan_in = fan_in;
    nsegs++;
    if (role == R_OTHER) {
        n_other++;
        fprintf(stderr, "oracle: layer %d saves '%s' (%ld values): role 'other'\n", layer_index, what, n);
    }
    kpos += n;
}

static float fan(long nweights, long nbiases)
{
    if (nbiases <= 0) return 1.0f;
    if (nweights % nbiases != 0)
        fprintf(stderr, "oracle: warning: nweights %ld not a multiple of nbiases %ld\n", nweights, nbiases);
    return (float)(nweights / nbiases);
}

/* same order as save_convolutional_weights */
static void fill_conv(layer *l, int i)
{
    long nw = l->nweights;
    fill(l->biases, l->n, R_BIAS, 0, i, "biases");
    if (l->batch_normalize) {
        fill(l->scales, l->n, R_SCALE, 0, i, "scales");
        fill(l->rolling_mean, l->n, R_MEAN, 0, i, "rolling_mean");
        fill(l->rolling_variance, l->n, R_VAR, 0, i, "rolling_variance");
    }
    fill(l->weights, nw, R_WEIGHT, fan(nw, l->n), i, "weights");
}
/* same order as save_connected_weights */
static void fill_connected(layer *l, int i)
{
    long nw = (long)l->outputs * l->inputs;
    fill(l->biases, l->outputs, R_BIAS, 0, i, "biases");
    fill(l->weights, nw, R_WEIGHT, fan(nw, l->outputs), i, "weights");
    if (l->batch_normalize) {
        fill(l->scales, l->outputs, R_SCALE, 0, i, "scales");
        fill(l->rolling_mean, l->outputs, R_MEAN, 0, i, "rolling_mean");
        fill(l->rolling_variance, l->outputs, R_VAR, 0, i, "rolling_variance");
    }
}
static void fill_batchnorm(layer *l, int i)
{
#ifdef ALEXEYAB
    fill(l->biases, l->c, R_BIAS, 0, i, "biases");
#endif
    fill(l->scales, l->c, R_SCALE, 0, i, "scales");
    fill(l->rolling_mean, l->c, R_MEAN, 0, i, "rolling_mean");
    fill(l->rolling_variance, l->c, R_VAR, 0, i, "rolling_variance");
}
static void fill_local(layer *l, int i)
{
    long locations = (long)l->out_w * l->out_h;
    long size = (long)l->size * l->size * l->c * l->n * locations;
    fill(l->biases, l->outputs, R_BIAS, 0, i, "biases");
    fill(l->weights, size, R_WEIGHT, fan(size, l->outputs), i, "weights");
}

/* walk the layers in save_weights_upto order */
static void fill_network(network *net)
{
    int i;
    for (i = 0; i < net->n; ++i) {
        layer *l = &net->layers[i];
#ifdef ALEXEYAB
        if (l->type == CONVOLUTIONAL && l->share_layer == NULL) fill_conv(l, i);
        if (l->type == SHORTCUT && l->nweights > 0) fill(l->weights, l->nweights, R_OTHER, 0, i, "shortcut weights");
        if (l->type == IMPLICIT) fill(l->weights, l->nweights, R_OTHER, 0, i, "implicit weights");
        if (l->type == CONNECTED) fill_connected(l, i);
        if (l->type == BATCHNORM) fill_batchnorm(l, i);
        if (l->type == RNN) {
            fill_connected(l->input_layer, i); fill_connected(l->self_layer, i); fill_connected(l->output_layer, i);
        }
        if (l->type == GRU) {
            fill_connected(l->input_z_layer, i); fill_connected(l->input_r_layer, i); fill_connected(l->input_h_layer, i);
            fill_connected(l->state_z_layer, i); fill_connected(l->state_r_layer, i); fill_connected(l->state_h_layer, i);
        }
        if (l->type == LSTM) {
            fill_connected(l->wf, i); fill_connected(l->wi, i); fill_connected(l->wg, i); fill_connected(l->wo, i);
            fill_connected(l->uf, i); fill_connected(l->ui, i); fill_connected(l->ug, i); fill_connected(l->uo, i);
        }
        if (l->type == CONV_LSTM) {
            if (l->peephole) { fill_conv(l->vf, i); fill_conv(l->vi, i); fill_conv(l->vo, i); }
            fill_conv(l->wf, i);
            if (!l->bottleneck) { fill_conv(l->wi, i); fill_conv(l->wg, i); fill_conv(l->wo, i); }
            fill_conv(l->uf, i); fill_conv(l->ui, i); fill_conv(l->ug, i); fill_conv(l->uo, i);
        }
        if (l->type == CRNN) {
            fill_conv(l->input_layer, i); fill_conv(l->self_layer, i); fill_conv(l->output_layer, i);
        }
        if (l->type == LOCAL) fill_local(l, i);
#else
        if (l->dontsave) continue;
        if (l->type == CONVOLUTIONAL || l->type == DECONVOLUTIONAL) fill_conv(l, i);
        if (l->type == CONNECTED) fill_connected(l, i);
        if (l->type == BATCHNORM) fill_batchnorm(l, i);
        if (l->type == RNN) {
            fill_connected(l->input_layer, i); fill_connected(l->self_layer, i); fill_connected(l->output_layer, i);
        }
        if (l->type == LSTM) {
            fill_connected(l->wi, i); fill_connected(l->wf, i); fill_connected(l->wo, i); fill_connected(l->wg, i);
            fill_connected(l->ui, i); fill_connected(l->uf, i); fill_connected(l->uo, i); fill_connected(l->ug, i);
        }
        if (l->type == GRU) {
            fill_connected(l->wz, i); fill_connected(l->wr, i); fill_connected(l->wh, i);
            fill_connected(l->uz, i); fill_connected(l->ur, i); fill_connected(l->uh, i);
        }
        if (l->type == CRNN) {
            fill_conv(l->input_layer, i); fill_conv(l->self_layer, i); fill_conv(l->output_layer, i);
        }
        if (l->type == LOCAL) fill_local(l, i);
#endif
    }
}

/* read net.weights back and compare every value with the rule, bit for bit */
static int verify_weights(const char *path, long *file_bytes)
{
    FILE *fp = fopen(path, "rb");
    int32_t hdr[3]; uint64_t seen;
    int s; long bad = 0;
    if (!fp) { fprintf(stderr, "oracle: cannot reopen %s\n", path); return 0; }
    fseek(fp, 0, SEEK_END); *file_bytes = ftell(fp); fseek(fp, 0, SEEK_SET);
    if (fread(hdr, 4, 3, fp) != 3 || fread(&seen, 8, 1, fp) != 1) { fclose(fp); return 0; }
    if (*file_bytes != (long)(20 + 4 * kpos)) {
        fprintf(stderr, "oracle: VERIFY size %ld != 20 + 4*%llu\n", *file_bytes, (unsigned long long)kpos);
        fclose(fp); return 0;
    }
    for (s = 0; s < nsegs; ++s) {
        uint64_t j;
        for (j = 0; j < segs[s].count; ++j) {
            float v, want;
            uint32_t k = (uint32_t)(segs[s].start + j);
            if (fread(&v, 4, 1, fp) != 1) { fclose(fp); return 0; }
            want = rule_value(k, segs[s].role, segs[s].fan_in);
            if (memcmp(&v, &want, 4) != 0) {
                if (bad < 5) fprintf(stderr, "oracle: VERIFY mismatch at k=%u (%s): %.9g != %.9g\n",
                                     k, role_name[segs[s].role], v, want);
                bad++;
            }
        }
    }
    fclose(fp);
    return bad == 0;
}

static void write_stats(FILE *out, int i, layer *l)
{
    long n = l->outputs, j;
    double sum = 0, sq = 0, mean = 0, var = 0, maxabs = 0;
    long nonfinite = 0, nfin = 0;
    int bn = (l->type == CONVOLUTIONAL || l->type == CONNECTED) ? l->batch_normalize : -1;
    fprintf(out, "%d %s %d %d %d %ld %d", i, get_layer_string(l->type), l->out_w, l->out_h, l->out_c, n, bn);
    if (!l->output || n <= 0) {
        fprintf(out, " nan nan nan 0");
        for (j = 0; j < 8; ++j) fprintf(out, " nan");
        fprintf(out, "\n");
        return;
    }
    for (j = 0; j < n; ++j) {
        float v = l->output[j];
        if (!isfinite(v)) { nonfinite++; continue; }
        sum += v; nfin++;
        if (fabs((double)v) > maxabs) maxabs = fabs((double)v);
    }
    if (nfin > 0) {
        mean = sum / nfin;
        for (j = 0; j < n; ++j) {
            float v = l->output[j];
            if (!isfinite(v)) continue;
            sq += ((double)v - mean) * ((double)v - mean);
        }
        var = sq / nfin;
    } else { mean = NAN; var = NAN; maxabs = NAN; }
    fprintf(out, " %.17g %.17g %.9g %ld", mean, sqrt(var), maxabs, nonfinite);
    for (j = 0; j < 8; ++j) {
        long p = (j * (n - 1)) / 7;   /* floor(j*(outputs-1)/7) */
        fprintf(out, " %.9g", l->output[p]);
    }
    fprintf(out, "\n");
}

int main(int argc, char **argv)
{
    char path[4096];
    network *net;
    long file_bytes = 0, ninput, k;
    float *input;
    int i, ok;
    FILE *meta, *out;
#ifdef ALEXEYAB
    network netv;
#endif
    if (argc != 3 && !(argc == 4 && strcmp(argv[3], "--shapes") == 0)) {
        fprintf(stderr, "usage: oracle CFG OUTDIR [--shapes]\n"); return 2;
    }
#ifdef ALEXEYAB
    netv = parse_network_cfg_custom(argv[1], 1, 1);
    net = &netv;
#else
    net = parse_network_cfg(argv[1]);
    set_batch_network(net, 1);
#endif
    fprintf(stderr, "oracle: parsed %d layers, input %d x %d x %d (inputs %d, batch %d)\n",
            net->n, net->w, net->h, net->c, net->inputs, net->batch);
    if (argc == 4) {
        snprintf(path, sizeof path, "%s/shapes.txt", argv[2]);
        out = fopen(path, "w");
        for (i = 0; i < net->n; ++i) {
            layer *l = &net->layers[i];
            fprintf(out, "%d %s %d %d %d\n", i, get_layer_string(l->type), l->out_w, l->out_h, l->out_c);
        }
        fclose(out);
        return 0;
    }
    fill_network(net);
    snprintf(path, sizeof path, "%s/segments.txt", argv[2]);
    out = fopen(path, "w");
    for (i = 0; i < nsegs; ++i)
        fprintf(out, "%llu %llu %s %.9g\n", (unsigned long long)segs[i].start,
                (unsigned long long)segs[i].count, role_name[segs[i].role], segs[i].fan_in);
    fclose(out);
    snprintf(path, sizeof path, "%s/net.weights", argv[2]);
#ifdef ALEXEYAB
    save_weights(netv, path);
#else
    save_weights(net, path);
#endif
    ok = verify_weights(path, &file_bytes);
    snprintf(path, sizeof path, "%s/meta.txt", argv[2]);
    meta = fopen(path, "w");
    fprintf(meta, "n %d\nw %d\nh %d\nc %d\ninputs %d\nbatch %d\nweights_bytes %ld\nstream_values %llu\nverify %d\nother_segments %d\n",
            net->n, net->w, net->h, net->c, net->inputs, net->batch, file_bytes,
            (unsigned long long)kpos, ok, n_other);
    fclose(meta);
    printf("weights_bytes %ld verify %d\n", file_bytes, ok);
    fflush(stdout);
    if (!ok) { fprintf(stderr, "oracle: weights verification FAILED\n"); return 4; }

    /* input: value k over the whole (batch-sized) buffer; batch is 1 */
    ninput = (long)net->inputs * (net->batch > 0 ? net->batch : 1);
    input = (float *)calloc(ninput, sizeof(float));
    for (k = 0; k < ninput; ++k) input[k] = u_of((uint32_t)k + 0x9E3779B9u);
#ifdef ALEXEYAB
    network_predict(netv, input);
#else
    network_predict(net, input);
#endif
    snprintf(path, sizeof path, "%s/layers.txt", argv[2]);
    out = fopen(path, "w");
    for (i = 0; i < net->n; ++i) write_stats(out, i, &net->layers[i]);
    fclose(out);
    fprintf(stderr, "oracle: done\n");
    return 0;
}
