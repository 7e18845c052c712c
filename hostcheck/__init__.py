"""gpunode hostcheck: readiness checks for PyTorch GPU training nodes.

Only the standard library is imported here; torch and NVML (nvidia-ml-py) are loaded lazily by the
gatherers and reported as "not installed" when missing.
"""

#: The one version of the wheel (pyproject.toml reads it) and of the collection gpunode.node (galaxy.yml, checked
#: equal by tests/test_packaging.py); CHANGELOG.md has its entry.
__version__ = "0.1.0"
#: Version of the --json document; bump on any incompatible change (docs/hostcheck.md).
SCHEMA_VERSION = 1
