"""Workload checks (GPU matmul, bandwidth, AMP step, DataLoader, DDP/NCCL, burn-in): ordinary registered
checks of ``snapshot.workload``, the run that hostcheck.gather.workload launched.

compute.py judges one GPU's speed, paths.py the paths between GPUs, training.py the training path; grading.py holds
the judging functions (their lines are rows of hostcheck/data/thresholds.json) and sku.py the achievable figures per
GPU model. Every check of category ``workload`` runs GPU jobs: ``--quick``
leaves them (and so their gatherer) out. Tests judge recorded runs, never a GPU.

Importing this package registers nothing: compute, paths and training register their checks when a profile that
runs the workload imports them (hostcheck.checks.MODULES); peers serves the report and the fleet page too.
"""
