"""GPU-NIC placement by PCIe topology, in NCCL's words (pure: the fabric checks, the baseline, the port records and
the GPUDirect probe use it). Never by name order: with ten or more RDMA devices mlx5_10 sorts before mlx5_2.

NCCL's distances (NCCL's environment variable documentation, NCCL_P2P_LEVEL and NCCL_NET_GDR_LEVEL): PIX through at
most one PCIe switch, PXB through several switches without the host bridge, PHB through the PCIe host bridge (the
CPU) of one NUMA node, SYS across the SMP interconnect between NUMA nodes (QPI/UPI). NCCL uses GPUDirect RDMA up to
PXB unless NCCL_NET_GDR_LEVEL says otherwise (src/graph/paths.cc, ``ncclTopoCheckGdr``: ``netGdrLevel =
PATH_PXB``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hostcheck.gather.rdma import PciPath, RdmaSnapshot

PIX, PXB, PHB, SYS = "PIX", "PXB", "PHB", "SYS"
#: NCCL's path types between a GPU and a NIC, nearest first (NCCL_NET_GDR_LEVEL's values but LOC).
LEVELS = (PIX, PXB, PHB, SYS)
#: Where NCCL uses GPUDirect RDMA by default (src/graph/paths.cc: netGdrLevel = PATH_PXB).
NEAR = (PIX, PXB)


@dataclass(frozen=True)
class Pairing:
    """A GPU and the RDMA NIC it uses: its own (the nearest NIC no other GPU took) or, where the node has fewer
    NICs than GPUs, one it shares (``shared``)."""

    gpu: str  # PCI address
    nic: str | None  # RDMA device name (mlx5_0), None when there is no NIC at all
    level: str  # PIX, PXB, PHB or SYS; "" without a NIC
    shared: bool = False
    #: The bridges between the two (for ACS): below the deepest common bridge, and that bridge itself.
    bridges: tuple[str, ...] = ()
    nic_address: str = ""


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def distance(g: PciPath, n: PciPath) -> tuple[str, int, tuple[str, ...]]:
    """NCCL's word for the PCIe path between ``g`` and ``n``, the bridges it crosses (fewer is nearer) and
    those bridges."""
    shared = _common(g.bridges, n.bridges) if g.root == n.root else 0
    if shared:
        below_g, below_n = len(g.bridges) - shared, len(n.bridges) - shared
        between = (g.bridges[shared - 1], *g.bridges[shared:], *n.bridges[shared:])
        # Under one switch: each hangs off a downstream port of the deepest common bridge.
        return (PIX if max(below_g, below_n) <= 1 else PXB), below_g + below_n + 1, between
    between = tuple(dict.fromkeys((*g.bridges, *n.bridges)))
    hops = len(g.bridges) + len(n.bridges) + 2
    if g.numa_node is not None and n.numa_node is not None and g.numa_node != n.numa_node:
        return SYS, hops + 1, between
    # One NUMA node, or one whose node is not known: never said to be across the sockets without knowing it.
    return PHB, hops, between


def level_rank(level: str) -> int:
    return LEVELS.index(level) if level in LEVELS else len(LEVELS)


def pair_gpus(snap: RdmaSnapshot) -> tuple[Pairing, ...]:
    """Each GPU's NIC by PCIe topology, never by name (mlx5_10 sorts before mlx5_2).

    The GPUs, in PCI address order, take their own NIC nearest first: all GPUs at PIX, then PXB, PHB, SYS, each
    the unused NIC with the fewest bridges between them (then the lower PCI address). Only NICs of the model the
    GPUs have near them (within PXB: the rails' board_id; with none near, the most numerous model) are taken, so
    a front-end or storage NIC never stands in for a missing rail. A GPU left without one shares the nearest
    (``shared``)."""
    if not isinstance(snap.devices, tuple):
        return ()
    names = {d.pci: d.name for d in snap.devices if d.pci}
    board = {d.name: d.board_id for d in snap.devices}
    nics = sorted((n for n in snap.nics if n.address in names), key=lambda n: n.address)
    gpus = sorted(snap.gpus, key=lambda g: g.address)
    dist = {(g.address, n.address): distance(g, n) for g in gpus for n in nics}
    rail_boards = {
        board[names[n.address]] for g in gpus for n in nics if dist[g.address, n.address][0] in NEAR
    }
    if not rail_boards and nics:
        # No NIC near any GPU (a VM hides the switches): the rails are the most numerous model, never a lone
        # front-end NIC.
        models = [board[names[n.address]] for n in nics]
        top = max(models.count(m) for m in models)
        rail_boards = {m for m in models if models.count(m) == top}
    candidates = [n for n in nics if board[names[n.address]] in rail_boards]
    taken: dict[str, Pairing] = {}
    used: set[str] = set()
    for level in LEVELS:
        for g in gpus:
            if g.address in taken:
                continue
            free = [n for n in candidates if n.address not in used and dist[g.address, n.address][0] == level]
            if free:
                n = min(free, key=lambda n: (dist[g.address, n.address][1], n.address))
                lv, _hops, between = dist[g.address, n.address]
                taken[g.address] = Pairing(g.address, names[n.address], lv, False, between, n.address)
                used.add(n.address)
    out = []
    for g in gpus:
        if g.address in taken:
            out.append(taken[g.address])
        elif candidates:
            n = min(
                candidates,
                key=lambda n: (
                    level_rank(dist[g.address, n.address][0]),
                    dist[g.address, n.address][1],
                    n.address,
                ),
            )
            lv, _hops, between = dist[g.address, n.address]
            out.append(Pairing(g.address, names[n.address], lv, True, between, n.address))
        else:
            out.append(Pairing(g.address, None, ""))
    return tuple(out)


def rails(snap: RdmaSnapshot, pairs: tuple[Pairing, ...] | None = None) -> frozenset[str] | None:
    """The RDMA devices that are GPU rails: within PXB of a GPU, or some GPU's own NIC. None when the node's PCI
    topology tells nothing (no GPU or no NIC with a readable path): then no port can be told a rail or not."""
    if not snap.gpus or not snap.nics or not isinstance(snap.devices, tuple):
        return None
    names = {d.pci: d.name for d in snap.devices if d.pci}
    near = {
        names[n.address]
        for g in snap.gpus
        for n in snap.nics
        if n.address in names and distance(g, n)[0] in NEAR
    }
    own = {p.nic for p in (pair_gpus(snap) if pairs is None else pairs) if p.nic and not p.shared}
    return frozenset(near | own)


def missing_rails(pairs: tuple[Pairing, ...]) -> list[Pairing]:
    """GPUs without a NIC of their own within PXB while other GPUs have one: where a rail NIC is missing."""
    if not any(p.nic and not p.shared and p.level in NEAR for p in pairs):
        return []
    return [p for p in pairs if (p.nic is None or p.shared) and p.level not in NEAR]


def nic_gpus(
    snap: RdmaSnapshot, pairs: tuple[Pairing, ...] | None = None, near_only: bool = False
) -> dict[str, str]:
    """RDMA device -> the PCI address of the GPU it serves: the GPU whose own NIC it is, else (a second rail of
    a GPU) the nearest GPU within PXB. Devices serving no GPU are left out; ``near_only``: own NICs farther than
    PXB too."""
    pairs = pair_gpus(snap) if pairs is None else pairs
    out = {p.nic: p.gpu for p in pairs if p.nic and not p.shared and (p.level in NEAR or not near_only)}
    if not isinstance(snap.devices, tuple):
        return out
    names = {d.pci: d.name for d in snap.devices if d.pci}
    for n in sorted(snap.nics, key=lambda n: n.address):
        name = names.get(n.address)
        if name is None or name in out:
            continue
        near = [(distance(g, n), g.address) for g in snap.gpus]
        near = [(d, a) for d, a in near if d[0] in NEAR]
        if near:
            out[name] = min(near, key=lambda x: (level_rank(x[0][0]), x[0][1], x[1]))[1]
    return out
