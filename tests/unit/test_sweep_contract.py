"""Where a sweep process stands (hostcheck.sweep.contract): torch's contract as torchrun and a PyTorchJob set it,
Slurm's as srun sets it (srun(1), OUTPUT ENVIRONMENT VARIABLES), the compressed host list, and every wrong or
missing variable refused by name."""

from __future__ import annotations

import pytest

from hostcheck.sweep.contract import MAX_NODES, ContractError, derive, expand_hostlist

# What torchrun sets for a worker with c10d rendezvous (torch.distributed.run: the agent keeps the store).
TORCHRUN = {
    "RANK": "2",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "1",
    "GROUP_RANK": "2",
    "MASTER_ADDR": "node-a",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "sweep42",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
}
# What Kubeflow's training operator sets in a PyTorchJob's pod (MASTER_ADDR: the master replica's service).
PYTORCHJOB = {
    "MASTER_ADDR": "sweep-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "3",
    "RANK": "1",
    "PYTHONUNBUFFERED": "1",
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
}
# srun -N4 --ntasks-per-node=1 on the third node.
SRUN = {
    "SLURM_PROCID": "2",
    "SLURM_NTASKS": "4",
    "SLURM_NNODES": "4",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "2",
    "SLURM_JOB_ID": "1234",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_NODELIST": "gpu[07-09],login1",
    "SLURM_STEP_NODELIST": "gpu[07-09],login1",
}


def test_torchrun_gives_the_rank_and_the_agents_store():
    c = derive(TORCHRUN)
    assert (c.rank, c.world, c.master_addr, c.master_port) == (2, 4, "node-a", 29400)
    assert c.launcher == "torchrun" and c.agent_store and c.run_id == "torchrun-sweep42-0"


def test_a_pytorchjob_gives_the_rank_and_rank_0_keeps_the_store():
    c = derive(PYTORCHJOB)
    assert (c.rank, c.world, c.master_addr, c.master_port, c.launcher) == (
        1,
        3,
        "sweep-master-0",
        23456,
        "kubernetes",
    )
    assert not c.agent_store


def test_srun_gives_the_rank_and_rank_0_is_the_first_host():
    c = derive(SRUN)
    assert (c.rank, c.world, c.master_addr, c.master_port, c.launcher) == (2, 4, "gpu07", 29500, "slurm")
    assert c.hosts == ("gpu07", "gpu08", "gpu09", "login1") and c.run_id == "slurm-1234.0"
    assert derive({**SRUN, "MASTER_PORT": "31000"}).master_port == 31000
    assert derive(SRUN, port=30000).master_port == 30000
    # An sbatch script that exports WORLD_SIZE (without RANK) still runs on Slurm's variables.
    assert derive({**SRUN, "WORLD_SIZE": "4"}).launcher == "slurm"


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ("node1",)),
        ("gpu[01-03,7]", ("gpu01", "gpu02", "gpu03", "gpu7")),
        ("a[1-2]b[3-4]", ("a1b3", "a1b4", "a2b3", "a2b4")),
        ("gpu[098-101],x", ("gpu098", "gpu099", "gpu100", "gpu101", "x")),
    ],
)
def test_slurm_host_lists_expand(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text", ["gpu[1-", "gpu1]", "gpu[a-b]", "gpu[3-1]", "a,,b", "gpu[0-99999999]", "gpu[1]x;rm"]
)
def test_a_bad_host_list_is_refused_by_name(text):
    with pytest.raises(ContractError) as info:
        expand_hostlist(text)
    assert info.value.variable == "SLURM_JOB_NODELIST"


def test_no_contract_at_all_names_rank():
    with pytest.raises(ContractError) as info:
        derive({"PATH": "/usr/bin"})
    assert info.value.variable == "RANK" and "torchrun, srun or a PyTorchJob" in str(info.value)


@pytest.mark.parametrize(
    ("env", "variable", "said"),
    [
        ({**PYTORCHJOB, "RANK": "abc"}, "RANK", "'abc' is not a whole number"),
        ({**PYTORCHJOB, "RANK": "-1"}, "RANK", "not a whole number"),
        ({**PYTORCHJOB, "RANK": "3"}, "RANK", "not below WORLD_SIZE 3"),
        ({**PYTORCHJOB, "WORLD_SIZE": "0"}, "WORLD_SIZE", "out of range"),
        ({**PYTORCHJOB, "WORLD_SIZE": str(MAX_NODES + 1)}, "WORLD_SIZE", "out of range"),
        ({k: v for k, v in PYTORCHJOB.items() if k != "MASTER_ADDR"}, "MASTER_ADDR", "not set"),
        ({k: v for k, v in PYTORCHJOB.items() if k != "WORLD_SIZE"}, "WORLD_SIZE", "not set"),
        ({**PYTORCHJOB, "MASTER_PORT": "99999"}, "MASTER_PORT", "out of range"),
        ({**PYTORCHJOB, "MASTER_PORT": "80a"}, "MASTER_PORT", "not a whole number"),
        ({**PYTORCHJOB, "MASTER_ADDR": "a b"}, "MASTER_ADDR", "not a host name"),
        ({**PYTORCHJOB, "MASTER_ADDR": "x\x1b[2J"}, "MASTER_ADDR", "\\x1b"),
        ({**TORCHRUN, "LOCAL_RANK": "1"}, "LOCAL_RANK", "one process per node"),
        ({**TORCHRUN, "LOCAL_WORLD_SIZE": "8"}, "LOCAL_WORLD_SIZE", "one process per node"),
        ({**SRUN, "SLURM_LOCALID": "3"}, "SLURM_LOCALID", "one process per node"),
        ({**SRUN, "SLURM_PROCID": "4"}, "SLURM_PROCID", "not below SLURM_NTASKS 4"),
        ({**SRUN, "SLURM_NTASKS": "8", "SLURM_NPROCS": "8"}, "SLURM_STEP_NODELIST", "4 hosts for 8 tasks"),
        ({k: v for k, v in SRUN.items() if "NODELIST" not in k}, "SLURM_JOB_NODELIST", "not set"),
        ({**SRUN, "SLURM_STEP_NODELIST": "gpu[1-"}, "SLURM_STEP_NODELIST", "without its ']'"),
    ],
)
def test_a_wrong_or_missing_variable_is_refused_by_name(env, variable, said):
    with pytest.raises(ContractError) as info:
        derive(env)
    assert info.value.variable == variable and said in str(info.value), str(info.value)


def test_a_node_runs_one_rank_per_gpu_it_sees(tmp_path):
    from hostcheck.sweep.ranks import local_gpus

    # What the NVIDIA driver creates: one /dev/nvidiaN per GPU beside its control and UVM devices.
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "nvme0"):
        (tmp_path / name).touch()
    assert local_gpus("auto", {}, str(tmp_path)) == 2
    assert local_gpus("auto", {"CUDA_VISIBLE_DEVICES": "3,5,7"}, str(tmp_path)) == 3
    assert local_gpus("auto", {"CUDA_VISIBLE_DEVICES": ""}, str(tmp_path)) == 0
    assert local_gpus("auto", {"CUDA_VISIBLE_DEVICES": "-1"}, str(tmp_path)) == 0
    assert local_gpus("cpu", {}, str(tmp_path)) == 0
    assert local_gpus("auto", {}, str(tmp_path / "absent")) == 0


def test_a_host_list_past_the_bound_is_refused_before_it_is_built():
    import tracemalloc

    # 10,000 x 100 names: over MAX_NODES; refused from the two ranges' lengths, not after a million names exist.
    tracemalloc.start()
    try:
        with pytest.raises(ContractError, match=f"more than {MAX_NODES} hosts"):
            expand_hostlist("r[0-9999]n[00-99]")
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes held on the way to a refusal"
