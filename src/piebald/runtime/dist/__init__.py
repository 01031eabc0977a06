"""The runtime's distributed core: process groups from a plan's explicit rank lists, uneven
shard layouts, flat parameter buffers, uneven reduce-scatter/all-gather, the sharded
optimizer step (ZeRO modes, clipping, loss scaling) and atomic sharded checkpoints.

Typical use on one rank (the pipeline executor drives the passes in between)::

    groups = build_process_groups(plan, timeout_s=60)          # every rank of the world
    buckets = build_buckets(groups, named_params=params, tied_name=tied)
    optimizer = ShardedOptimizer(buckets, config=config, used_group=groups.used)
    for step in ...:
        optimizer.gather_params()       # ZeRO FULL only; a no-op otherwise
        ...forward/backward of this rank's micro-batches (loss weighted by 1/num_tokens)...
        optimizer.release_params()
        result = optimizer.step(lr=lr)  # reduce-scatter, norm, clip, AdamW, all-gather
"""
