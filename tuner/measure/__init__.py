"""Measuring: the reference problems (model shapes x phases x dtypes), their weights,
and the worker process that verifies and times variants."""
