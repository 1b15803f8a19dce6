"""What is done to an image on its way to the model: the Inception pipelines, the crop-first forms of the
classification preprocessings, Darknet's augmentations, and detection's transforms, mosaic and multi-scale sizes."""
