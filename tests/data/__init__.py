"""Tests of bigbatch/data/: the data sets, their order, decoding and preprocessing, packing and shards."""
