/*
 * Darknet's [yolo] training deltas: parse a .cfg with Darknet's own library
 * (AlexeyAB or pjreddie fork), feed every [yolo] layer a given input and given
 * truths, run the layer's own forward with train=1 and write its l.delta and
 * *l.cost.  Only Darknet's library API is called; no Darknet code is copied.
 *
 * Usage: yolo_delta CFG BATCH DIR [--shapes]
 *   --shapes: parse only; print "yolo_shape i w h n classes inputs" per [yolo] layer.
 *   DIR/truths.txt: one truth a line, "image x y w h class" (fractions of the
 *     input, as Darknet's label files; image 0..BATCH-1), in the order Darknet
 *     is to see them.
 *   DIR/input_<i>.f32: for the [yolo] layer at index i, BATCH * l.inputs
 *     float32 values in Darknet's layout (that of the NCHW input of the layer).
 * Writes DIR/delta_<i>.f32 (BATCH * l.outputs float32: l.delta after the
 * layer's forward) and prints "yolo_cost i cost w h n classes" per [yolo] layer.
 * The cfg's [net] width/height is the network input size the layer sees.
 * Build with build.sh (-DALEXEYAB for the AlexeyAB fork).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "darknet.h"

#ifdef ALEXEYAB
network parse_network_cfg_custom(char *filename, int batch, int time_steps);
#define TRUTH_SIZE 6 /* x, y, w, h, class, track id */
#else
#define TRUTH_SIZE 5 /* x, y, w, h, class */
#endif

#define MAX_TRUTHS 4096

static float *read_floats(const char *path, long n)
{
    FILE *fp = fopen(path, "rb");
    float *a = (float *)calloc(n, sizeof(float));
    if (!fp || !a) { fprintf(stderr, "yolo_delta: cannot read %s\n", path); exit(2); }
    if ((long)fread(a, sizeof(float), n, fp) != n) { fprintf(stderr, "yolo_delta: %s: short\n", path); exit(2); }
    fclose(fp);
    return a;
}

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 5) { fprintf(stderr, "usage: yolo_delta CFG BATCH DIR [--shapes]\n"); return 1; }
    int shapes_only = argc == 5 && strcmp(argv[4], "--shapes") == 0;
    int batch = atoi(argv[2]);
    const char *dir = argv[3];
    char path[4096];
    static float tb[MAX_TRUTHS][5];
    static int timg[MAX_TRUTHS];
    int ntruths = 0;
    if (!shapes_only) {
        snprintf(path, sizeof path, "%s/truths.txt", dir);
        FILE *fp = fopen(path, "r");
        if (!fp) { fprintf(stderr, "yolo_delta: cannot read %s\n", path); return 2; }
        while (ntruths < MAX_TRUTHS && fscanf(fp, "%d %f %f %f %f %f", &timg[ntruths], &tb[ntruths][0],
                                              &tb[ntruths][1], &tb[ntruths][2], &tb[ntruths][3], &tb[ntruths][4]) == 6)
            ntruths++;
        fclose(fp);
    }

#ifdef ALEXEYAB
    network net = parse_network_cfg_custom(argv[1], batch, 1);
#else
    network *pnet = parse_network_cfg(argv[1]);
    set_batch_network(pnet, batch);
    network net = *pnet;
#endif
    int i, b, t;
    for (i = 0; i < net.n; ++i) {
        layer l = net.layers[i];
        if (l.type != YOLO) continue;
        if (shapes_only) { printf("yolo_shape %d %d %d %d %d %d\n", i, l.w, l.h, l.n, l.classes, l.inputs); continue; }
        float *truth = (float *)calloc((size_t)batch * l.truths, sizeof(float));
        int count[1024] = {0};
        for (t = 0; t < ntruths; ++t) {
            b = timg[t];
            if (b < 0 || b >= batch || b >= 1024) { fprintf(stderr, "yolo_delta: image %d\n", b); return 2; }
            if ((count[b] + 1) * TRUTH_SIZE > l.truths) continue; /* the buffer Darknet's loader fills */
            memcpy(truth + b * l.truths + count[b] * TRUTH_SIZE, tb[t], 5 * sizeof(float));
            count[b]++;
        }
        snprintf(path, sizeof path, "%s/input_%d.f32", dir, i);
        float *input = read_floats(path, (long)batch * l.inputs);
#ifdef ALEXEYAB
        network_state state = {0};
        state.net = net;
        state.truth = truth;
        state.input = input;
        state.train = 1;
        state.index = i;
        l.forward(l, state);
#else
        network state = net;
        state.truth = truth;
        state.input = input;
        state.train = 1;
        state.index = i;
        l.forward(l, state);
#endif
        snprintf(path, sizeof path, "%s/delta_%d.f32", dir, i);
        FILE *out = fopen(path, "wb");
        if (!out || (long)fwrite(l.delta, sizeof(float), (size_t)batch * l.outputs, out) != (long)batch * l.outputs) {
            fprintf(stderr, "yolo_delta: cannot write %s\n", path);
            return 2;
        }
        fclose(out);
        printf("yolo_cost %d %.9g %d %d %d %d\n", i, *l.cost, l.w, l.h, l.n, l.classes);
        free(truth);
        free(input);
    }
    return 0;
}
