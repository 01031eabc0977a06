"""Planners: build plans for a cluster, a model and a job, and score them with the cost model."""
