"""The dataset formats, each registered in ``registry.DATASETS`` (digits, an image folder, shards and their
index with ``bigbatch pack``, COCO, the generated shapes set), what every format shares (the training set's size
without the data: ``counts.py``), and detection's records. Darknet's ``.data`` files and YOLO folders are
``darknet/``'s."""
