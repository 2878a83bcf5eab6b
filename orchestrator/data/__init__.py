"""Real data loaders (One Billion Word, WMT-style parallel text, ImageNet-style image
folders), a synthetic generator that writes small datasets in those same layouts, and
the global-batch sampler that shards every step's batch across data-parallel workers.
"""
