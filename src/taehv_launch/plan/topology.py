"""Topology: how many nodes, which node this is, GPUs per node, the main node's address.

Step 3 of the pipeline. `detect_topology` is pure: it reads only the mapping it is given
(the caller passes `os.environ`) and the CLI options, never the network or the GPUs.
`check_local_gpus` compares the result with the GPU count that preflight measured; it runs
at launch and in validate-env. `--dry-run` runs `check_listed_gpus` instead: the same lines for
what CUDA_VISIBLE_DEVICES lists, without torch or a GPU. Only the standard library is imported:
this module is on the CLI's fast path.

Where the node count and node rank come from, first match wins (`Topology.source`):

1. options        --num-nodes / --node-rank (source "options" when either is given; with
                  both, no scheduler variable is read except MASTER_ADDR / MASTER_PORT and
                  the job ids). --master-addr, --master-port and --gpus-per-node override
                  their field whatever the source. --num-nodes 1 means one node: the
                  scheduler's rank and address are ignored.
2. torchrun (PET_*)  Kubeflow PyTorchJob / TrainJob: PET_NNODES ("2", or "2:2"; an elastic
                  range "1:2" is refused), PET_NODE_RANK (else RANK), PET_MASTER_ADDR (else
                  MASTER_ADDR), PET_MASTER_PORT (else MASTER_PORT). Checked before 3 because
                  the Kubeflow training operator also sets WORLD_SIZE, to the *process* count.
3. cloud (WORLD_SIZE/RANK)  platforms that set WORLD_SIZE = node count and RANK = node rank
                  with MASTER_ADDR / MASTER_PORT (PAI-DLC, Volcano, the seeds' platform).
                  One of the two without the other is an error.
4. slurm          node count SLURM_STEP_NUM_NODES, else SLURM_NNODES, else SLURM_JOB_NUM_NODES;
                  rank SLURM_NODEID; main node MASTER_ADDR, else the first host of
                  SLURM_STEP_NODELIST / SLURM_NODELIST / SLURM_JOB_NODELIST. Used only for a
                  job of more than one node or when SLURM_NODEID is set.
5. kubernetes (JOB_COMPLETION_INDEX)  indexed Jobs: the index is the node rank; the node
                  count from NNODES or NUM_NODES (set it in the Job spec), the main node from
                  MASTER_ADDR (a headless Service name), both required for several nodes.
6. skypilot       SKYPILOT_NUM_NODES, SKYPILOT_NODE_RANK, first line of SKYPILOT_NODE_IPS.
7. single node    none of the above: one node, rank 0, main node 127.0.0.1. If the GPU count
                  is more than one node holds (`16 h100`: more than --gpus-per-node, default
                  8), it must be a multiple of it and resolves to gpus / per-node nodes with
                  node rank 0 assumed (source SOURCE_ASSUMED), so that `--dry-run` shows the
                  multi-node plan; `check_local_gpus` refuses to launch it.

Refused anywhere: running inside torchrun / accelerate launch (LOCAL_RANK, LOCAL_WORLD_SIZE
or TORCHELASTIC_RUN_ID set) and srun starting more than one task per node
(SLURM_STEP_NUM_TASKS > SLURM_STEP_NUM_NODES): the launcher starts the GPU processes itself.

GPUs per node: on one node, all requested GPUs (any count; fewer than the node has is fine).
Across nodes, --gpus-per-node (default 8) and nodes x GPUs per node must equal the GPU count:
`8 h100` on each of 2 nodes (the seeds' workaround) is refused with a suggestion. GPU ids are
local, 0..gpus_per_machine-1 on every node (passing 0-15 on 8-GPU nodes was the seeds'
"invalid device ordinal" crash).

Master port: --master-port, else the source's port variable, else MASTER_PORT, else 29500.
Main node address, wherever it came from: a hostname (RFC 1123), an IPv4 or an IPv6 address
(schedulers.check_host), refused in one line naming its origin, before anything is written.

Job id (for the run id; the same on every node): the source's own id, then SLURM_JOB_ID,
SKYPILOT_TASK_ID, MLP_TASK_ID (Volcengine ML platform). Source-specific: kubernetes reads
JOB_NAME, else HOSTNAME minus its "-<index>" suffix (indexed-Job pods are named
<job>-<index>); cloud and PET_* take the job name out of a main-node address shaped like
<job>-master-0, <job>-worker-0 or <job>-node-0-0[.svc] (PAI-DLC, Kubeflow, the seeds' platform).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from taehv_launch.errors import TopologyError

from .schedulers import (
    JOB_ID_VARS,
    LOCALHOST,
    NESTED_LAUNCH_VARS,
    SOURCE_ASSUMED,
    SOURCE_OPTIONS,
    SOURCE_SINGLE,
    check_host,
    check_port,
    env_int,
    first_set,
    from_scheduler,
    get_var,
)


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Where this launcher runs in the job. Every node of a job computes the same plan
    except `machine_rank`."""

    num_machines: int
    machine_rank: int
    gpus_per_machine: int  # processes per node
    main_process_ip: str  # "127.0.0.1" on a single node
    main_process_port: int
    source: str  # one of the SOURCE_* constants
    job_id: str | None = None  # scheduler job id, for the run id

    def __post_init__(self) -> None:
        if self.num_machines < 1 or self.gpus_per_machine < 1:
            raise TopologyError(
                f"invalid topology: {self.num_machines} nodes x {self.gpus_per_machine} GPUs per node: "
                "both must be at least 1"
            )
        if not 0 <= self.machine_rank < self.num_machines:
            raise TopologyError(
                f"invalid topology: node rank {self.machine_rank} is outside 0..{self.num_machines - 1}"
            )
        check_port(self.main_process_port, f"main_process_port {self.main_process_port}")
        check_host(self.main_process_ip, "main_process_ip")

    @property
    def gpu_ids(self) -> str:
        """Local GPU ids, the same on every node: "0,1,...,gpus_per_machine-1"."""
        return ",".join(str(i) for i in range(self.gpus_per_machine))

    @property
    def world_size(self) -> int:
        """Processes in the whole job."""
        return self.num_machines * self.gpus_per_machine

    def describe(self) -> str:
        """One line for logs and --dry-run."""
        nodes = f"{self.num_machines} node{'s' if self.num_machines > 1 else ''}"
        rank = f", this is node {self.machine_rank}" if self.num_machines > 1 else ""
        return (
            f"{nodes} x {self.gpus_per_machine} GPUs = {self.world_size} processes{rank}, "
            f"main node {self.main_process_ip}:{self.main_process_port}, from {self.source}"
        )


def detect_topology(
    gpus: int,
    env: Mapping[str, str],
    *,
    num_nodes: int | None = None,
    node_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    gpus_per_node: int | None = None,
    default_gpus_per_node: int = 8,
    default_port: int = 29500,
    profile: str | None = None,
    max_gpus: int | None = None,
) -> Topology:
    """Resolve the topology for `gpus` GPUs in all from the options and the scheduler `env`.

    See the module docstring for the sources and rules. `profile` only fills in the commands
    suggested by error messages, `max_gpus` (the profile's) keeps them to counts it takes.
    Raises TopologyError.
    """
    _check_options(gpus, num_nodes, node_rank, master_port, gpus_per_node)
    _refuse_nested_launch(env)
    profile = profile or "PROFILE"
    master_addr = (master_addr or "").strip() or None

    if num_nodes is not None and node_rank is not None:
        found = None  # nothing left for a scheduler to say but the address, read below
    else:
        options = {"num": num_nodes, "rank": node_rank, "addr": master_addr}
        found = from_scheduler(env, {name for name, value in options.items() if value is not None})

    # Node count.
    per_node = gpus_per_node or default_gpus_per_node
    derived = False
    if num_nodes is not None:
        num, num_from = num_nodes, "--num-nodes"
    elif found is not None and found.num is not None:
        num, num_from = found.num, found.num_from
    elif gpus <= per_node:
        num, num_from = 1, "no scheduler detected"
    elif gpus % per_node == 0:
        num, num_from, derived = gpus // per_node, f"{gpus} GPUs / {per_node} per node", True
    else:
        counts = [c for c in (gpus // per_node * per_node, (gpus // per_node + 1) * per_node) if c <= (max_gpus or c)]
        raise TopologyError(
            f"{gpus} GPUs are more than one node of {per_node} and not a whole number of nodes: "
            f"ask for {' or '.join(map(str, counts))} GPUs, or pass --gpus-per-node N with N dividing {gpus}"
        )

    # GPUs per node.
    if num == 1:
        if gpus_per_node is not None and gpus_per_node != gpus:
            whole = gpus % gpus_per_node == 0 and gpus > gpus_per_node
            more = f", or run on {gpus // gpus_per_node} nodes" if whole else ""
            raise TopologyError(
                f"{gpus} GPUs on 1 node ({num_from}) do not match --gpus-per-node {gpus_per_node}: "
                f"drop --gpus-per-node on a single node{more}"
            )
        per_node = gpus
    elif num * per_node != gpus:
        raise TopologyError(_split_message(gpus, num, num_from, per_node, default_gpus_per_node, profile))

    # Node rank.
    if node_rank is not None:
        rank, rank_from = node_rank, "--node-rank"
    elif num == 1:
        rank, rank_from = 0, "single node"
    elif found is not None and found.rank is not None:
        rank, rank_from = found.rank, found.rank_from
    elif derived:
        rank, rank_from = 0, "assumed"
    else:
        raise TopologyError(
            f"{num} nodes ({num_from}) but no node rank: "
            f"pass --node-rank (0 on the main node, 1..{num - 1} on the others)"
        )
    if not 0 <= rank < num:
        raise TopologyError(
            f"node rank {rank} ({rank_from}) is outside 0..{num - 1} for {num} nodes ({num_from}): "
            f"give each node its own rank in 0..{num - 1}, 0 on the main node"
        )

    # Main node address and port.
    if master_addr is not None:
        addr, addr_from = master_addr, "--master-addr"
    elif num == 1:
        addr, addr_from = LOCALHOST, ""
    elif found is not None and found.addr:
        addr, addr_from = found.addr, found.addr_from
    elif get_var(env, "MASTER_ADDR"):
        addr, addr_from = get_var(env, "MASTER_ADDR"), "MASTER_ADDR"
    elif derived and node_rank is None:
        addr, addr_from = LOCALHOST, ""  # shown by --dry-run; check_local_gpus refuses to launch it
    else:
        raise TopologyError(
            f"{num} nodes ({num_from}) but no address for the main node: "
            "pass --master-addr (hostname or IP of node rank 0) or set MASTER_ADDR"
        )
    if addr_from:  # torchrun would die on it after the run folder is written: refused in the plan
        check_host(addr, addr_from)
    if master_port is not None:
        port = master_port
    elif found is not None and found.port is not None:
        port = found.port
    else:
        port = env_int(env, "MASTER_PORT", port=True)
        port = default_port if port is None else port

    if num_nodes is not None or node_rank is not None:
        source = SOURCE_OPTIONS
    elif found is not None:
        source = found.source
    else:
        source = SOURCE_ASSUMED if derived else SOURCE_SINGLE
    fallback = first_set(env, *JOB_ID_VARS)
    job_id = (found.job_id if found is not None else None) or (get_var(env, fallback) if fallback else None)
    return Topology(
        num_machines=num,
        machine_rank=rank,
        gpus_per_machine=per_node,
        main_process_ip=addr,
        main_process_port=port,
        source=source,
        job_id=job_id,
    )


def listed_gpus(env: Mapping[str, str]) -> int | None:
    """How many GPUs CUDA_VISIBLE_DEVICES lists: None when it is unset (every GPU is visible), 0 when
    it hides them all ("" or "-1"). Entries are indices or GPU-/MIG- UUIDs; as in CUDA, a negative
    index ends the list. Anything else (a word, an empty entry, a repeat) is refused: CUDA would
    silently see fewer GPUs, or none. Reads only `env`: no torch, no GPU needed."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    entries = [e.strip() for e in raw.split(",")]
    if entries[-1] == "":  # "0,1," as CUDA reads it; "" alone hides every GPU
        entries.pop()
    seen: list[str] = []
    for entry in entries:
        if re.fullmatch(r"-\d+", entry):
            break
        if not (entry.isdigit() or re.fullmatch(r"(GPU|MIG)-[0-9A-Za-z/-]+", entry)):
            raise TopologyError(
                f"CUDA_VISIBLE_DEVICES={raw!r} is not a list of GPUs: {entry!r} is neither an index nor a GPU-/MIG- "
                f"UUID; unset it, or list the GPUs to use (e.g. CUDA_VISIBLE_DEVICES=0,1,2,3)"
            )
        key = str(int(entry)) if entry.isdigit() else entry
        if key in seen:
            raise TopologyError(f"CUDA_VISIBLE_DEVICES={raw!r} lists GPU {entry} twice: list each GPU once")
        seen.append(key)
    return len(seen)


def check_listed_gpus(topo: Topology, env: Mapping[str, str], *, profile: str | None = None) -> None:
    """`--dry-run`'s share of check_local_gpus, without torch or a GPU: refuse a CUDA_VISIBLE_DEVICES
    that is malformed or lists fewer GPUs than this node runs, with the launch's own line. Unset, it
    checks nothing (the plan may be for another machine)."""
    listed = listed_gpus(env)
    if listed is not None:
        _check_count(topo, listed, profile or "PROFILE")


def check_local_gpus(
    topo: Topology, visible_gpus: int, *, profile: str | None = None, env: Mapping[str, str] | None = None
) -> None:
    """Refuse to launch when this node cannot run its share of `topo`.

    `visible_gpus` is what this node sees (CUDA_VISIBLE_DEVICES applied); `env` (default: this
    process's environment) is checked for a malformed CUDA_VISIBLE_DEVICES first, as --dry-run does.
    Using fewer GPUs than the node has is fine. Raises TopologyError.
    """
    listed_gpus(os.environ if env is None else env)
    profile = profile or "PROFILE"
    n, g = topo.num_machines, topo.gpus_per_machine
    _check_any(visible_gpus)
    if topo.source == SOURCE_ASSUMED:
        raise TopologyError(
            f"{topo.world_size} GPUs need {n} nodes of {g} but no scheduler was detected: on every node run "
            f"`taehv-launch {topo.world_size} {profile} --node-rank R --master-addr ADDR` (R = 0..{n - 1}, "
            f"ADDR = node 0's address), or submit it through a scheduler; "
            f"on this node alone use at most {visible_gpus} GPUs"
        )
    _check_count(topo, visible_gpus, profile)


def _check_any(visible_gpus: int) -> None:
    if visible_gpus <= 0:
        raise TopologyError(
            "no GPU is visible on this node: check `nvidia-smi` and CUDA_VISIBLE_DEVICES, "
            "or run the CPU demo with `taehv-launch 1 cpu`"
        )


def _check_count(topo: Topology, visible_gpus: int, profile: str) -> None:
    """This node runs topo.gpus_per_machine processes: it needs that many visible GPUs."""
    _check_any(visible_gpus)
    n, g = topo.num_machines, topo.gpus_per_machine
    if g <= visible_gpus:
        return
    if n == 1:
        where = "" if topo.source == SOURCE_SINGLE else f" (1 node, from {topo.source})"
        fixes = [f"run `taehv-launch {visible_gpus} {profile}`"]
        if g % visible_gpus == 0:
            fixes.append(f"run on {g // visible_gpus} nodes")
        raise TopologyError(
            f"{g} GPUs requested but this node sees {visible_gpus}{where}: "
            + _either(fixes + ["check CUDA_VISIBLE_DEVICES"])
        )
    raise TopologyError(
        f"{n} nodes x {g} GPUs planned but node {topo.machine_rank} sees {visible_gpus}: run "
        f"`taehv-launch {n * visible_gpus} {profile} --gpus-per-node {visible_gpus}` on every node, "
        "or check CUDA_VISIBLE_DEVICES"
    )


def _refuse_nested_launch(env: Mapping[str, str]) -> None:
    for name in NESTED_LAUNCH_VARS:
        if get_var(env, name) is not None:
            raise TopologyError(
                f"taehv-launch is running under torchrun or accelerate launch ({name}={get_var(env, name)} is set): "
                "start it directly, once per node; it starts accelerate itself"
            )
    tasks, nodes = env_int(env, "SLURM_STEP_NUM_TASKS"), env_int(env, "SLURM_STEP_NUM_NODES")
    if tasks is not None and nodes is not None and tasks > nodes:
        raise TopologyError(
            f"srun started {tasks} tasks on {nodes} nodes, but taehv-launch must run once per node "
            "(it starts the GPU processes itself): use `srun --ntasks-per-node=1 taehv-launch ...`"
        )


def _check_options(
    gpus: int, num_nodes: int | None, node_rank: int | None, master_port: int | None, gpus_per_node: int | None
) -> None:
    if gpus < 1:
        raise TopologyError(f"the GPU count must be at least 1, got {gpus}")
    if num_nodes is not None and num_nodes < 1:
        raise TopologyError(f"--num-nodes must be at least 1, got {num_nodes}")
    if node_rank is not None and node_rank < 0:
        raise TopologyError(f"--node-rank must be 0 or more, got {node_rank}")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise TopologyError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    if master_port is not None:
        check_port(master_port, f"--master-port {master_port}")


def _split_message(gpus: int, num: int, num_from: str, per_node: int, default: int, profile: str) -> str:
    total = num * per_node
    fixes = [f"run `taehv-launch {total} {profile}` on each node"]
    if gpus % num == 0 and gpus // num != per_node and gpus // num <= max(per_node, default):
        fixes.append(f"pass --gpus-per-node {gpus // num}")
    if gpus % per_node == 0 and gpus // per_node != num:
        fixes.append(f"run on {gpus // per_node} node{'s' if gpus // per_node > 1 else ''}")
    return (
        f"{gpus} GPUs cannot be split over {num} nodes ({num_from}) x {per_node} GPUs per node "
        f"(= {total}): {_either(fixes)}"
    )


def _either(fixes: list[str]) -> str:
    """Join fixes: "a", "a, or b", "a, b, or c"."""
    return fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + ", or " + fixes[-1]
