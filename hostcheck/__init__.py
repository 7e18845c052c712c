"""gpunode hostcheck: readiness checks for PyTorch GPU training nodes.

Only the standard library is imported here; torch and NVML (nvidia-ml-py) are loaded lazily by the
gatherers and reported as "not installed" when missing.
"""

__version__ = "0.1.0"
#: Version of the --json document; bump on any incompatible change (docs/hostcheck.md).
SCHEMA_VERSION = 1
