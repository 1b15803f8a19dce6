#!/bin/sh
# Build the Darknet oracle against both forks' libdarknet.so (CPU builds).
# Usage: build.sh [DN_ROOT]   (default /tmp/dn; expects DN_ROOT/AlexeyAB and DN_ROOT/pjreddie)
# Produces oracle_alexeyab and oracle_pjreddie next to this script.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
DN=${1:-/tmp/dn}
CFLAGS="-O2 -ffp-contract=off -Wall -Wno-unused-result"
A=$DN/AlexeyAB
gcc $CFLAGS -DALEXEYAB -I"$A/include" "$HERE/oracle.c" -o "$HERE/oracle_alexeyab" \
    -L"$A" -ldarknet -Wl,-rpath,"$A" -lm -lpthread
P=$DN/pjreddie
gcc $CFLAGS -I"$P/include" "$HERE/oracle.c" -o "$HERE/oracle_pjreddie" \
    -L"$P" -ldarknet -Wl,-rpath,"$P" -lm -lpthread
echo "built $HERE/oracle_alexeyab $HERE/oracle_pjreddie"
gcc $CFLAGS -DALEXEYAB -I"$A/include" "$HERE/yolo_delta.c" -o "$HERE/yolo_delta_alexeyab" \
    -L"$A" -ldarknet -Wl,-rpath,"$A" -lm -lpthread
gcc $CFLAGS -I"$P/include" "$HERE/yolo_delta.c" -o "$HERE/yolo_delta_pjreddie" \
    -L"$P" -ldarknet -Wl,-rpath,"$P" -lm -lpthread
echo "built $HERE/yolo_delta_alexeyab $HERE/yolo_delta_pjreddie"
