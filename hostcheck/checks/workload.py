"""Workload checks (GPU matmul, bandwidth, AMP step, DDP/NCCL): the extension point for the workload issue.

How they plug in, without touching the core:

1. A gatherer that runs the GPU jobs in child processes of the training Python (the pattern of
   hostcheck.gather.torchinfo: training environment applied, timeout, JSON on stdout)::

       from hostcheck.gather import register_gatherer

       def gather_workload(options, parts):   # parts: "facts", "nvml", "torch" (TorchSnapshot.python), ...
           ...
           return run                          # any frozen value; lands in snapshot.extra["workload"]

       register_gatherer("workload", gather_workload, timeout_s=600)

2. Pure judging functions registered with ids ``workload.E<nnn>`` that name the gatherer in ``needs``::

       @check("workload.E001", "Matmul throughput, bf16", weight=2, needs=("workload", "nvml"))
       def matmul_bf16(s):
           run = s.extra["workload"]            # an Unavailable if the gatherer failed or timed out
           ...

3. Import the module that does both from hostcheck/checks/__init__.py.

Every check of category ``workload`` is a workload check: ``--quick`` leaves them (and so their gatherer)
out, ``--only workload`` runs just them. Tests drive the judging from recorded runs, never from a GPU.
"""

from hostcheck.workload.integration import register_all

register_all()
