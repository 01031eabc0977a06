"""Runtime: train a model under a plan on torch.distributed (NCCL on GPUs, gloo on CPU), or
emulate a cluster on CPU processes. The only part of piebald that imports torch."""
