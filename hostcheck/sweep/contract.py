"""Where this process stands in the job: torch's distributed contract, or Slurm's, read from the environment.

torch's contract (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK; torch.distributed's "environment
variable initialization") is what torchrun sets for each worker and what Kubeflow's PyTorchJob sets in each pod
(MASTER_ADDR is the master replica's service, RANK the replica's index). Under ``srun`` without them, Slurm's
variables stand in (srun(1), "OUTPUT ENVIRONMENT VARIABLES"): SLURM_PROCID is the rank, SLURM_NTASKS the world,
the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) runs rank 0 (srun's default block distribution)
and is MASTER_ADDR, MASTER_PORT defaults to ``--port``. The sweep runs one process per node: a LOCAL_RANK or
SLURM_LOCALID other than 0 is refused. Every refusal names the variable and its value. Pure: tested from dicts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

#: The most nodes one sweep takes (and the most hosts a Slurm host list may expand to).
MAX_NODES = 65536
DEFAULT_PORT = 29500
TORCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._:\[\]-]{0,252})")


class ContractError(ValueError):
    """A variable of the contract is missing or wrong: ``variable`` names it."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


@dataclass(frozen=True)
class Contract:
    rank: int
    world: int
    master_addr: str
    master_port: int
    #: torchrun, slurm, kubernetes or env (set by hand, or another launcher).
    launcher: str
    run_id: str
    #: torchrun's agent already keeps the store at MASTER_ADDR:MASTER_PORT: every rank only connects to it.
    agent_store: bool = False
    #: The hosts by node rank, where the launcher says (Slurm's node list).
    hosts: tuple[str, ...] = field(default=())


def _shown(value: str) -> str:
    text = value if len(value) <= 40 else value[:37] + "..."
    return repr(text) if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _int(env: Mapping[str, str], name: str, low: int, high: int) -> int:
    raw = env.get(name)
    if raw is None:
        raise ContractError(name, "not set")
    text = raw.strip()
    if not text.isascii() or not text.isdigit():
        raise ContractError(name, f"{_shown(raw)} is not a whole number")
    value = int(text)
    if not low <= value <= high:
        raise ContractError(name, f"{value} is out of range ({low} to {high})")
    return value


def _addr(env: Mapping[str, str], name: str, value: str) -> str:
    if not _HOST.fullmatch(value):
        raise ContractError(name, f"{_shown(value)} is not a host name or address")
    return value


def expand_hostlist(text: str, name: str = "SLURM_JOB_NODELIST") -> tuple[str, ...]:
    """Slurm's compressed host list (``gpu[01-03,7],login1``, ``r[1-2]n[1-2]``) expanded, in order; ranges keep the
    width of their first number. More than MAX_NODES hosts, or a list that does not parse, raises ContractError."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if depth < 0:
            raise ContractError(name, f"{_shown(text)}: a ']' without its '['")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ContractError(name, f"{_shown(text)}: a '[' without its ']'")
    items.append(text[start:])
    out: list[str] = []
    for item in items:
        if not item:
            raise ContractError(name, f"{_shown(text)}: an empty host name")
        names = [""]
        for part in re.split(r"(\[[^\]]*\])", item):
            if part.startswith("["):
                numbers = _ranges(part[1:-1], text, name)
                # The bound before the product: r[0-60000]n[0-60000] would build 3.6 billion names first.
                if len(names) * len(numbers) + len(out) > MAX_NODES:
                    raise ContractError(name, f"more than {MAX_NODES} hosts")
                names = [n + x for n in names for x in numbers]
            else:
                names = [n + part for n in names]
            if len(names) + len(out) > MAX_NODES:
                raise ContractError(name, f"more than {MAX_NODES} hosts")
        out += names
    for host in out:
        _addr({}, name, host)
    return tuple(out)


def _ranges(spec: str, text: str, name: str) -> list[str]:
    out: list[str] = []
    for piece in spec.split(","):
        lo, dash, hi = piece.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or not lo.isascii() or not hi.isascii():
            raise ContractError(name, f"{_shown(text)}: {_shown(piece)} is not a number or range")
        a, b = int(lo), int(hi) if dash else int(lo)
        if b < a or b - a >= MAX_NODES:
            raise ContractError(name, f"{_shown(text)}: {_shown(piece)} is not a range")
        out += [str(x).zfill(len(lo)) for x in range(a, b + 1)]
        if len(out) > MAX_NODES:
            raise ContractError(name, f"more than {MAX_NODES} hosts")
    return out


def derive(env: Mapping[str, str], port: int = DEFAULT_PORT) -> Contract:
    """This process's place in the job (raises ContractError naming the variable)."""
    if "RANK" in env:
        return _torch(env)
    if "SLURM_PROCID" in env:
        return _slurm(env, port)
    if any(k in env for k in TORCH_VARS):
        return _torch(env)
    raise ContractError(
        "RANK",
        "not set, nor SLURM_PROCID: start the sweep under torchrun, srun or a PyTorchJob (one process per node), or "
        "set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT",
    )


def _one_per_node(env: Mapping[str, str], name: str) -> None:
    if name in env and _int(env, name, 0, MAX_NODES) != 0:
        raise ContractError(
            name, f"{env[name].strip()}: the sweep runs one process per node (start one task per node)"
        )


def _torch(env: Mapping[str, str]) -> Contract:
    for name in TORCH_VARS:
        if name not in env:
            raise ContractError(
                name, "not set (torch's contract needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"
            )
    world = _int(env, "WORLD_SIZE", 1, MAX_NODES)
    rank = _int(env, "RANK", 0, MAX_NODES)
    if rank >= world:
        raise ContractError("RANK", f"{rank} is not below WORLD_SIZE {world}")
    _one_per_node(env, "LOCAL_RANK")
    if "LOCAL_WORLD_SIZE" in env and _int(env, "LOCAL_WORLD_SIZE", 1, MAX_NODES) != 1:
        raise ContractError(
            "LOCAL_WORLD_SIZE", f"{env['LOCAL_WORLD_SIZE'].strip()}: the sweep runs one process per node"
        )
    addr = _addr(env, "MASTER_ADDR", env["MASTER_ADDR"].strip())
    port = _int(env, "MASTER_PORT", 1, 65535)
    if env.get("TORCHELASTIC_RUN_ID"):
        launcher = "torchrun"
        run_id = f"torchrun-{env['TORCHELASTIC_RUN_ID']}-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    elif env.get("KUBERNETES_SERVICE_HOST"):
        launcher, run_id = "kubernetes", "kubernetes"
    else:
        launcher, run_id = "env", "env"
    agent = str(env.get("TORCHELASTIC_USE_AGENT_STORE", "")).lower() == "true"
    return Contract(rank, world, addr, port, launcher, _safe(run_id), agent)


def _slurm(env: Mapping[str, str], port: int) -> Contract:
    world = (
        _int(env, "SLURM_NTASKS", 1, MAX_NODES)
        if "SLURM_NTASKS" in env
        else _int(env, "SLURM_NPROCS", 1, MAX_NODES)
    )
    rank = _int(env, "SLURM_PROCID", 0, MAX_NODES)
    if rank >= world:
        raise ContractError("SLURM_PROCID", f"{rank} is not below SLURM_NTASKS {world}")
    _one_per_node(env, "SLURM_LOCALID")
    name = "SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
    if not env.get(name):
        raise ContractError("SLURM_JOB_NODELIST", "not set (srun sets it: run the sweep under srun)")
    hosts = expand_hostlist(env[name].strip(), name)
    if len(hosts) != world:
        raise ContractError(
            name,
            f"{len(hosts)} hosts for {world} tasks: the sweep runs one task per node (srun --ntasks-per-node=1)",
        )
    addr = _addr(env, "MASTER_ADDR", env["MASTER_ADDR"].strip()) if env.get("MASTER_ADDR") else hosts[0]
    master_port = _int(env, "MASTER_PORT", 1, 65535) if "MASTER_PORT" in env else port
    run_id = f"slurm-{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}"
    return Contract(rank, world, addr, master_port, "slurm", _safe(run_id), False, hosts)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:100]
