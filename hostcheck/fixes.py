"""The fixes hostcheck's hints name: role variables and playbook tags (one place, to keep them in step
with the roles; docs/design.md holds the shared names)."""

from __future__ import annotations

from typing import Any

from hostcheck import platform

PLAYBOOK = "playbooks/site.yml"


def role_fix(assignment: str, role: str, tags: str) -> str:
    """``set gpunode_tuning_shm_size: 64G (role gpunode_tuning) and re-run playbooks/site.yml --tags shm``"""
    return f"set {assignment} (role {role}) and re-run {PLAYBOOK} --tags {tags}"


def rerun(role: str, tags: str) -> str:
    return f"re-run {PLAYBOOK} --tags {tags} (role {role})"


TUNING = "gpunode_tuning"
DRIVER = "gpunode_driver"
PYTORCH = "gpunode_pytorch"
CUDA = "gpunode_cuda"

_NOT_LOADED = (
    "; if it is installed but not loaded: check the nouveau blacklist and Secure Boot (mokutil --sb-state), "
    "then modprobe nvidia"
)


def driver_install(os_id: Any = "", version_id: Any = "") -> str:
    """How to get a driver on this OS, from the platform data: its default source and branch."""
    data = platform.load()
    key, row = platform.os_row_for(data, os_id, version_id)
    branch, source = platform.default_branch(data, row)
    if source == "distro":
        newest = platform.branch_to_move_to(data) or data["defaults"]["driver_branch"]
        life = platform.branch_lifecycle(data, branch)
        ended = f", a branch NVIDIA ended in {life['end_of_life']}" if life["ended"] else ""
        return (
            rerun(DRIVER, "driver")
            + f" (it installs {key}'s own {branch} driver{ended}; for branch {newest} set gpunode_driver_source: "
            f"nvidia and gpunode_driver_branch: {newest})" + _NOT_LOADED
        )
    return role_fix(f"gpunode_driver_branch: {branch}", DRIVER, "driver") + _NOT_LOADED


DRIVER_MISMATCH = (
    "the kernel module and libnvidia-ml differ (packages upgraded under a loaded driver): reboot the node; "
    + role_fix("gpunode_driver_hold: true", DRIVER, "driver")
    + " so upgrades cannot do it again"
)
FABRICMANAGER = (
    role_fix("gpunode_driver_fabricmanager: auto", DRIVER, "driver")
    + " (it installs Fabric Manager matched to the driver where NVSwitches are found and starts it); "
    "then journalctl -u nvidia-fabricmanager; a fabric probe still in progress right after boot finishes "
    "within minutes"
)
FABRICMANAGER_VERSION = (
    "Fabric Manager must be the driver's exact version: "
    + role_fix("gpunode_driver_version: <the driver version>", DRIVER, "driver")
    + " (the pin and the hold cover both), then reboot if the driver changed"
)
PERSISTENCE = role_fix("gpunode_driver_persistence_enabled: true", DRIVER, "driver")
EXPECTED_GPUS = (
    "pass --expect-gpus N, or set gpunode_driver_expected_gpu_count: N (role gpunode_driver) so the fact "
    "records it"
)
GPU_DRAIN = (
    "drain the node, reset the GPU (nvidia-smi -r -i {idx}) and run dcgmi diag -r 3; "
    "open an RMA if it comes back"
)
PYTORCH_INSTALL = role_fix("gpunode_pytorch_index: {index}", PYTORCH, "pytorch")
NVML_PY = "install nvidia-ml-py in hostcheck's Python: pip install nvidia-ml-py"
SHM = role_fix("gpunode_tuning_shm_size: {size}", TUNING, "shm")
ALLOCATOR = role_fix("gpunode_tuning_allocator: tcmalloc", TUNING, "allocator")
MALLOC_CONF = role_fix(
    'gpunode_tuning_jemalloc_conf: "dirty_decay_ms:-1,muzzy_decay_ms:-1"', TUNING, "allocator"
)
PILLOW_SIMD = role_fix("gpunode_tuning_pillow_simd_enabled: true", TUNING, "pillow_simd")
PILLOW_SIMD_REINSTALL = (
    "stock Pillow was installed over pillow-simd (torchvision pulls it): "
    "{python} -m pip install --force-reinstall --no-deps pillow-simd, or " + rerun(TUNING, "pillow_simd")
)
PILLOW_SIMD_FEATURES = (
    "rebuild pillow-simd with its codecs: "
    + rerun(TUNING, "pillow_simd")
    + " (gpunode_tuning_pillow_simd_features lists them; the role installs their -dev packages and checks the build)"
)
NUMA = role_fix("gpunode_tuning_numa_enabled: true", TUNING, "numa")
THREADS = role_fix("gpunode_tuning_omp_num_threads: {n}", TUNING, "threading")
SERVICES = role_fix("gpunode_tuning_services_disable: [{names}]", TUNING, "services")
GOVERNOR = role_fix("gpunode_tuning_cpu_governor: performance", TUNING, "sysknobs")
THP = role_fix("gpunode_tuning_thp: madvise", TUNING, "sysknobs")
MEMLOCK = role_fix("gpunode_tuning_limits_memlock: unlimited", TUNING, "sysknobs") + ", then log in again"
NOFILE = role_fix("gpunode_tuning_limits_nofile: 1048576", TUNING, "sysknobs") + ", then log in again"
#: gpunode_tuning's defaults of the variables the fixes above set (roles/gpunode_tuning/defaults/main.yml; a test
#: keeps them equal): where the role already has them, re-running it changes nothing.
TUNING_DEFAULTS = {"shm_size": "50%", "limits_memlock": "unlimited", "limits_nofile": 1048576}
# Inside a container the runtime sets /dev/shm and the process limits, and a process inside cannot raise them:
# Docker's `docker container run` reference (--shm-size, 64 MB when unset; --ipc=host; --ulimit, values in bytes,
# -1 unlimited), NVIDIA's Containers User Guide, "Setting The Shared Memory Flag" (--shm-size=1g --ulimit
# memlock=-1, or --ipc=host for PyTorch's DataLoader); Kubernetes, Volumes, "emptyDir" (medium: Memory, sizeLimit);
# Kubernetes has no per-pod rlimit, so a pod gets the container runtime's own (containerd's systemd unit).
RUNTIME_SHM = (
    "the container runtime sizes /dev/shm, not gpunode_tuning: docker or podman run --shm-size={size} (or "
    "--ipc=host); Kubernetes: an emptyDir volume with medium: Memory and sizeLimit: {k8s} mounted at /dev/shm"
)
RUNTIME_MEMLOCK = (
    "the container runtime sets it, not gpunode_tuning (whose default is already unlimited): docker or podman run "
    "--ulimit memlock=-1; Kubernetes: LimitMEMLOCK=infinity in the container runtime's systemd unit (containerd)"
)
RUNTIME_NOFILE = (
    "the container runtime sets it, not gpunode_tuning (whose default is already 1048576): docker or podman run "
    "--ulimit nofile=1048576:1048576; Kubernetes: LimitNOFILE=1048576 in the container runtime's systemd unit"
)
ENV_FILE = rerun(TUNING, "allocator,threading,numa") + " to write /etc/gpunode/training.env"
