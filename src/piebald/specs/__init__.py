"""Pure data describing what piebald plans for: cluster, devices, model, job and plan.

Nothing here imports torch; a test enforces it.
"""
