"""Topology: how many nodes, which node this is, GPUs per node, the main node's address.

Step 3 of the pipeline. `detect_topology` is pure: it reads only the mapping it is given
(the caller passes `os.environ`) and the CLI options, never the network or the GPUs.
`check_local_gpus` compares the result with the GPU count that preflight measured; it runs
at launch and in validate-env, never on --dry-run. Only the standard library is imported:
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

Job id (for the run id; the same on every node): the source's own id, then SLURM_JOB_ID,
SKYPILOT_TASK_ID, MLP_TASK_ID (Volcengine ML platform). Source-specific: kubernetes reads
JOB_NAME, else HOSTNAME minus its "-<index>" suffix (indexed-Job pods are named
<job>-<index>); cloud and PET_* take the job name out of a main-node address shaped like
<job>-master-0, <job>-worker-0 or <job>-node-0-0[.svc] (PAI-DLC, Kubeflow, the seeds' platform).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from taehv_launch.errors import TopologyError

LOCALHOST = "127.0.0.1"

SOURCE_OPTIONS = "options"
SOURCE_PET = "torchrun (PET_*)"
SOURCE_CLOUD = "cloud (WORLD_SIZE/RANK)"
SOURCE_SLURM = "slurm"
SOURCE_KUBERNETES = "kubernetes (JOB_COMPLETION_INDEX)"
SOURCE_SKYPILOT = "skypilot"
SOURCE_SINGLE = "single node"
SOURCE_ASSUMED = "single node (no scheduler detected; node rank 0 assumed)"

# Set in every process that torchrun (and so accelerate launch) starts.
_NESTED_LAUNCH_VARS = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
# Scheduler job ids tried after the source's own, in this order.
_JOB_ID_VARS = ("SLURM_JOB_ID", "SKYPILOT_TASK_ID", "MLP_TASK_ID")
# <job>-master-0, <job>-worker-3, <job>-node-0-0.<service>: pod names of PAI-DLC, Kubeflow.
_REPLICA_HOST = re.compile(
    r"^(?P<job>[A-Za-z0-9][A-Za-z0-9-]*?)-(?:master|worker|node)-\d+(?:-\d+)?(?:\..*)?$"
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
        _check_port(self.main_process_port, f"main_process_port {self.main_process_port}")

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


@dataclass(frozen=True, kw_only=True)
class _Found:
    """What one scheduler's variables say. `*_from` name the variable, for messages."""

    source: str
    num: int | None = None
    num_from: str = ""
    rank: int | None = None
    rank_from: str = ""
    addr: str | None = None
    port: int | None = None
    job_id: str | None = None


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
) -> Topology:
    """Resolve the topology for `gpus` GPUs in all from the options and the scheduler `env`.

    See the module docstring for the sources and rules. `profile` only fills in the commands
    suggested by error messages. Raises TopologyError.
    """
    _check_options(gpus, num_nodes, node_rank, master_port, gpus_per_node)
    _refuse_nested_launch(env)
    profile = profile or "PROFILE"
    master_addr = (master_addr or "").strip() or None

    if num_nodes is not None and node_rank is not None:
        found = None  # nothing left for a scheduler to say but the address, read below
    else:
        options = {"num": num_nodes, "rank": node_rank, "addr": master_addr}
        found = _from_scheduler(env, {name for name, value in options.items() if value is not None})

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
        lower, upper = gpus // per_node * per_node, (gpus // per_node + 1) * per_node
        raise TopologyError(
            f"{gpus} GPUs are more than one node of {per_node} and not a whole number of nodes: "
            f"ask for {lower} or {upper} GPUs, or pass --gpus-per-node N with N dividing {gpus}"
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
        addr = master_addr
    elif num == 1:
        addr = LOCALHOST
    elif found is not None and found.addr:
        addr = found.addr
    elif _get(env, "MASTER_ADDR"):
        addr = _get(env, "MASTER_ADDR")
    elif derived and node_rank is None:
        addr = LOCALHOST  # shown by --dry-run; check_local_gpus refuses to launch it
    else:
        raise TopologyError(
            f"{num} nodes ({num_from}) but no address for the main node: "
            "pass --master-addr (hostname or IP of node rank 0) or set MASTER_ADDR"
        )
    if master_port is not None:
        port = master_port
    elif found is not None and found.port is not None:
        port = found.port
    else:
        port = _env_int(env, "MASTER_PORT", port=True)
        port = default_port if port is None else port

    if num_nodes is not None or node_rank is not None:
        source = SOURCE_OPTIONS
    elif found is not None:
        source = found.source
    else:
        source = SOURCE_ASSUMED if derived else SOURCE_SINGLE
    fallback = _first_set(env, *_JOB_ID_VARS)
    job_id = (found.job_id if found is not None else None) or (_get(env, fallback) if fallback else None)
    return Topology(
        num_machines=num,
        machine_rank=rank,
        gpus_per_machine=per_node,
        main_process_ip=addr,
        main_process_port=port,
        source=source,
        job_id=job_id,
    )


def check_local_gpus(topo: Topology, visible_gpus: int, *, profile: str | None = None) -> None:
    """Refuse to launch when this node cannot run its share of `topo`.

    `visible_gpus` is what this node sees (CUDA_VISIBLE_DEVICES applied). Using fewer GPUs
    than the node has is fine. Raises TopologyError.
    """
    profile = profile or "PROFILE"
    n, g = topo.num_machines, topo.gpus_per_machine
    if visible_gpus <= 0:
        raise TopologyError(
            "no GPU is visible on this node: check `nvidia-smi` and CUDA_VISIBLE_DEVICES, "
            "or run the CPU demo with `taehv-launch 1 cpu`"
        )
    if topo.source == SOURCE_ASSUMED:
        raise TopologyError(
            f"{topo.world_size} GPUs need {n} nodes of {g} but no scheduler was detected: on every node run "
            f"`taehv-launch {topo.world_size} {profile} --node-rank R --master-addr ADDR` (R = 0..{n - 1}, "
            f"ADDR = node 0's address), or submit it through a scheduler; "
            f"on this node alone use at most {visible_gpus} GPUs"
        )
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


def slurm_first_host(nodelist: str) -> str:
    """First host of a compressed SLURM node list ("node[01-04,07]" -> "node01",
    "gpu-a[1-2],gpu-b3" -> "gpu-a1", "n1,n2" -> "n1", "host" -> "host")."""
    depth, end = 0, len(nodelist)
    for i, char in enumerate(nodelist):  # the first comma outside brackets ends the first item
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            end = i
            break
    first = nodelist[:end].strip()
    # Each bracket group "[01-04,07]" contributes its first value, zero padding kept.
    host = re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0].strip(), first)
    if not host or "[" in host or "]" in host:
        raise TopologyError(f"cannot read the first host of the SLURM node list {nodelist!r}: set MASTER_ADDR")
    return host


# --- sources -------------------------------------------------------------------------------


def _from_scheduler(env: Mapping[str, str], given: set[str]) -> _Found | None:
    """The first scheduler whose variables are set. `given` names the fields the options
    already provide ("num", "rank", "addr"): a source does not insist on those."""
    if _get(env, "PET_NNODES"):
        return _from_pet(env, given)
    if _get(env, "WORLD_SIZE") or _get(env, "RANK"):
        return _from_cloud(env)
    nodes_var = _first_set(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    if nodes_var is not None:
        found = _from_slurm(env, nodes_var, given)
        if found is not None:
            return found
    if _get(env, "JOB_COMPLETION_INDEX"):
        return _from_kubernetes(env, given)
    if _get(env, "SKYPILOT_NUM_NODES"):
        return _from_skypilot(env, given)
    return None


def _from_pet(env: Mapping[str, str], given: set[str]) -> _Found:
    raw = _get(env, "PET_NNODES")
    low, _, high = raw.partition(":")
    num = _parse_int("PET_NNODES", raw, low, minimum=1)
    if high and _parse_int("PET_NNODES", raw, high, minimum=1) != num:
        raise TopologyError(
            f"PET_NNODES={raw!r} is an elastic node range, which is not supported: "
            "give the job a fixed node count (min = max replicas) or pass --num-nodes"
        )
    rank_var = "PET_NODE_RANK" if _get(env, "PET_NODE_RANK") else "RANK"
    rank = _env_int(env, rank_var)
    if rank is None and "rank" not in given and num > 1:
        raise TopologyError(f"PET_NNODES={raw} is set but PET_NODE_RANK is not: pass --node-rank")
    addr = _get(env, "PET_MASTER_ADDR") or _get(env, "MASTER_ADDR")
    port_var = "PET_MASTER_PORT" if _get(env, "PET_MASTER_PORT") else "MASTER_PORT"
    return _Found(
        source=SOURCE_PET, num=num, num_from=f"PET_NNODES={raw}", rank=rank, rank_from=f"{rank_var}={rank}",
        addr=addr, port=_env_int(env, port_var, port=True), job_id=_job_from_host(addr),
    )


def _from_cloud(env: Mapping[str, str]) -> _Found:
    world, rank = _env_int(env, "WORLD_SIZE", minimum=1), _env_int(env, "RANK")
    if world is None or rank is None:
        have, missing = ("WORLD_SIZE", "RANK") if world is not None else ("RANK", "WORLD_SIZE")
        raise TopologyError(
            f"{have}={_get(env, have)} is set but {missing} is not: set both (WORLD_SIZE = node count, "
            f"RANK = this node's rank), unset {have}, or pass --num-nodes and --node-rank"
        )
    addr = _get(env, "MASTER_ADDR")
    return _Found(
        source=SOURCE_CLOUD, num=world, num_from=f"WORLD_SIZE={world}", rank=rank, rank_from=f"RANK={rank}",
        addr=addr, port=_env_int(env, "MASTER_PORT", port=True), job_id=_job_from_host(addr),
    )


def _from_slurm(env: Mapping[str, str], nodes_var: str, given: set[str]) -> _Found | None:
    num = _env_int(env, nodes_var, minimum=1)
    rank = _env_int(env, "SLURM_NODEID")
    if num == 1 and rank is None:
        return None  # a one-node allocation outside a job step: nothing to coordinate
    if rank is None and "rank" not in given:
        raise TopologyError(
            f"SLURM reports {num} nodes but SLURM_NODEID is not set: start taehv-launch once per node "
            "with `srun --ntasks-per-node=1 taehv-launch ...`"
        )
    addr = _get(env, "MASTER_ADDR")
    if not addr and num > 1 and "addr" not in given:
        nodelist_var = _first_set(env, "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
        if nodelist_var is None:
            raise TopologyError(f"SLURM reports {num} nodes but no node list: set MASTER_ADDR or pass --master-addr")
        addr = slurm_first_host(_get(env, nodelist_var))
    return _Found(
        source=SOURCE_SLURM, num=num, num_from=f"{nodes_var}={num}", rank=rank, rank_from=f"SLURM_NODEID={rank}",
        addr=addr, port=_env_int(env, "MASTER_PORT", port=True), job_id=_get(env, "SLURM_JOB_ID"),
    )


def _from_kubernetes(env: Mapping[str, str], given: set[str]) -> _Found:
    rank = _env_int(env, "JOB_COMPLETION_INDEX")
    nodes_var = "NNODES" if _get(env, "NNODES") else "NUM_NODES"
    num = _env_int(env, nodes_var, minimum=1)
    if num is None and "num" not in given:
        raise TopologyError(
            f"Kubernetes indexed Job (JOB_COMPLETION_INDEX={rank}) but no node count: set NNODES in the "
            "Job's env to its completions (= parallelism), or pass --num-nodes"
        )
    addr = _get(env, "MASTER_ADDR")
    if not addr and (num or 0) > 1 and "addr" not in given:
        raise TopologyError(
            "Kubernetes indexed Job but MASTER_ADDR is not set: create a headless Service for the Job and set "
            "MASTER_ADDR=<job>-0.<service> (the index-0 pod), or pass --master-addr"
        )
    job = _get(env, "JOB_NAME")
    host = _get(env, "HOSTNAME")
    if not job and host and rank is not None and host.endswith(f"-{rank}"):
        job = host[: -len(f"-{rank}")]
    return _Found(
        source=SOURCE_KUBERNETES, num=num, num_from=f"{nodes_var}={num}",
        rank=rank, rank_from=f"JOB_COMPLETION_INDEX={rank}",
        addr=addr, port=_env_int(env, "MASTER_PORT", port=True), job_id=job or None,
    )


def _from_skypilot(env: Mapping[str, str], given: set[str]) -> _Found:
    num = _env_int(env, "SKYPILOT_NUM_NODES", minimum=1)
    rank = _env_int(env, "SKYPILOT_NODE_RANK")
    if rank is None and "rank" not in given and num > 1:
        raise TopologyError("SKYPILOT_NUM_NODES is set but SKYPILOT_NODE_RANK is not: pass --node-rank")
    ips = (_get(env, "SKYPILOT_NODE_IPS") or "").split()
    return _Found(
        source=SOURCE_SKYPILOT, num=num, num_from=f"SKYPILOT_NUM_NODES={num}",
        rank=rank, rank_from=f"SKYPILOT_NODE_RANK={rank}",
        addr=_get(env, "MASTER_ADDR") or (ips[0] if ips else None),
        port=_env_int(env, "MASTER_PORT", port=True), job_id=_get(env, "SKYPILOT_TASK_ID"),
    )


# --- helpers -------------------------------------------------------------------------------


def _refuse_nested_launch(env: Mapping[str, str]) -> None:
    for name in _NESTED_LAUNCH_VARS:
        if _get(env, name) is not None:
            raise TopologyError(
                f"taehv-launch is running under torchrun or accelerate launch ({name}={_get(env, name)} is set): "
                "start it directly, once per node; it starts accelerate itself"
            )
    tasks, nodes = _env_int(env, "SLURM_STEP_NUM_TASKS"), _env_int(env, "SLURM_STEP_NUM_NODES")
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
        _check_port(master_port, f"--master-port {master_port}")


def _check_port(port: int, label: str) -> None:
    if not 1 <= port <= 65535:
        raise TopologyError(f"{label} is not a port: use 1-65535 (29500 is the usual one)")


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


def _job_from_host(addr: str | None) -> str | None:
    match = _REPLICA_HOST.match(addr or "")
    return match["job"] if match else None


def _first_set(env: Mapping[str, str], *names: str) -> str | None:
    """The first of `names` that is set (not empty) in `env`."""
    return next((name for name in names if _get(env, name)), None)


def _get(env: Mapping[str, str], name: str) -> str | None:
    """The stripped value of `name`; None when unset or empty."""
    value = env.get(name)
    value = value.strip() if value is not None else None
    return value or None


def _env_int(env: Mapping[str, str], name: str, *, minimum: int = 0, port: bool = False) -> int | None:
    raw = _get(env, name)
    if raw is None:
        return None
    value = _parse_int(name, raw, raw, minimum=minimum)
    if port:
        _check_port(value, f"{name}={raw}")
    return value


def _parse_int(name: str, raw: str, text: str, *, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TopologyError(f"{name}={raw!r} is not an integer: fix or unset {name}") from None
    if value < minimum:
        raise TopologyError(f"{name}={raw!r} must be at least {minimum}: fix or unset {name}")
    return value
