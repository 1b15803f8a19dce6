"""Datasets, the data order and the loaders."""
