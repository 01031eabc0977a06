"""The runtime's distributed core: process groups from a plan's explicit rank lists, uneven
shard layouts, flat parameter buffers, uneven reduce-scatter/all-gather, the sharded
optimizer step (ZeRO modes, clipping, loss scaling) and atomic sharded checkpoints.

Typical use on one rank, with each stage in one bucket (``stream_layers=False``, as the
optimizer's tests drive it)::

    groups = build_process_groups(plan, timeout_s=60)  # every rank of the world, idle too
    buckets = build_buckets(groups, named_params=params, tied_name=tied,
                            stream_layers=False)  # used ranks
    optimizer = ShardedOptimizer(buckets, config=config, used_group=groups.used)
    for step in ...:
        optimizer.gather_params()       # ZeRO FULL only; a no-op otherwise
        ...forward/backward of this rank's micro-batches: loss weighted by
           1/num_tokens_in_global_batch, backward on optimizer.scale_loss(loss)...
        optimizer.release_params()      # ZeRO FULL only, after the last backward
        result = optimizer.step(lr=lr)  # reduce-scatter, norm, clip, AdamW, all-gather
        save_checkpoint(directory, step=step + 1, optimizer=optimizer,
                        group=groups.used, rank=rank)  # every K steps

Contract for the caller:

* ``params`` are the stage part's trainable parameters under **global** names, each
  Parameter once. On the first and last stage of a tied model, ``tied`` names the tied
  weight in that list; the last stage lists its head weight under the embedding's name.
* Never ``zero_grad(set_to_none=True)`` between micro-batches: gradients accumulate in
  one fp32 flat buffer, as views of it under fp32 compute (a cleared or replaced ``.grad``
  is copied back, at a cost) or through post-accumulate hooks under 16-bit compute.
* Collectives must be called equally often on every rank of their group: ``step``,
  ``gather_params`` (every rank of a FULL stage, even one with no micro-batch this step),
  an extra ``bucket.reduce_gradients()`` (ZeRO-2 style, stage bucket only).
* Under ZeRO FULL keep parameters gathered from a micro-batch's forward until its
  backward is done: autograd saved views of them.
* Idle ranks call only ``build_process_groups``.

Training streams instead (``build_buckets``' default): a ZeRO-2/3 stage gets one bucket
per layer, and the pipeline executor's ``LayerStream`` gathers each layer's parameters
(ZeRO-3) for every pass and reduce-scatters its gradients after every backward, so a
ZeRO-3 rank never holds its stage's whole weights; ``gather_params(streamed=False)`` is
left for the buckets that are not streamed. ``cost.memory`` prices the streamed runtime.
"""
