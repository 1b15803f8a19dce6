"""Tests of bigbatch/darknet/: networks from a .cfg, .weights files and the YOLO loss, against Darknet's own."""
