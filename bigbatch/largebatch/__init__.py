"""The large-batch techniques (LR scaling, warmup and decay, optimizers, clipping, weight EMA, BatchNorm corrections,
cross-device BN, loss scaling, rescaling a config to another batch), each one small idea with its source
(docs/references.md). The YAML files that use them are the recipes, in `bigbatch/configs/`."""
