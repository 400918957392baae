"""What each scheduler's environment variables say about the nodes (topology.py's sources 2-6).

Pure: reads only the mapping it is given; the order in which sources are tried, and the
rules that combine them with the CLI options, are in topology.py.
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
NESTED_LAUNCH_VARS = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
# Scheduler job ids tried after the source's own, in this order.
JOB_ID_VARS = ("SLURM_JOB_ID", "SKYPILOT_TASK_ID", "MLP_TASK_ID")
# <job>-master-0, <job>-worker-3, <job>-node-0-0.<service>: pod names of PAI-DLC, Kubeflow.
_REPLICA_HOST = re.compile(r"^(?P<job>[A-Za-z0-9][A-Za-z0-9-]*?)-(?:master|worker|node)-\d+(?:-\d+)?(?:\..*)?$")


@dataclass(frozen=True, kw_only=True)
class Found:
    """What one scheduler's variables say. `*_from` name the variable, for messages."""

    source: str
    num: int | None = None
    num_from: str = ""
    rank: int | None = None
    rank_from: str = ""
    addr: str | None = None
    addr_from: str = ""
    port: int | None = None
    job_id: str | None = None


def from_scheduler(env: Mapping[str, str], given: set[str]) -> Found | None:
    """The first scheduler whose variables are set. `given` names the fields the options
    already provide ("num", "rank", "addr"): a source does not insist on those."""
    if get_var(env, "PET_NNODES"):
        return _from_pet(env, given)
    if get_var(env, "WORLD_SIZE") or get_var(env, "RANK"):
        return _from_cloud(env)
    nodes_var = first_set(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    if nodes_var is not None:
        found = _from_slurm(env, nodes_var, given)
        if found is not None:
            return found
    if get_var(env, "JOB_COMPLETION_INDEX"):
        return _from_kubernetes(env, given)
    if get_var(env, "SKYPILOT_NUM_NODES"):
        return _from_skypilot(env, given)
    return None


def _from_pet(env: Mapping[str, str], given: set[str]) -> Found:
    raw = get_var(env, "PET_NNODES")
    low, _, high = raw.partition(":")
    num = parse_int("PET_NNODES", raw, low, minimum=1)
    if high and parse_int("PET_NNODES", raw, high, minimum=1) != num:
        raise TopologyError(
            f"PET_NNODES={raw!r} is an elastic node range, which is not supported: "
            "give the job a fixed node count (min = max replicas) or pass --num-nodes"
        )
    rank_var = "PET_NODE_RANK" if get_var(env, "PET_NODE_RANK") else "RANK"
    rank = env_int(env, rank_var)
    if rank is None and "rank" not in given and num > 1:
        raise TopologyError(f"PET_NNODES={raw} is set but PET_NODE_RANK is not: pass --node-rank")
    addr_var = "PET_MASTER_ADDR" if get_var(env, "PET_MASTER_ADDR") else "MASTER_ADDR"
    addr = get_var(env, addr_var)
    port_var = "PET_MASTER_PORT" if get_var(env, "PET_MASTER_PORT") else "MASTER_PORT"
    return Found(
        source=SOURCE_PET,
        num=num,
        num_from=f"PET_NNODES={raw}",
        rank=rank,
        rank_from=f"{rank_var}={rank}",
        addr=addr,
        addr_from=addr_var,
        port=env_int(env, port_var, port=True),
        job_id=job_from_host(addr),
    )


def _from_cloud(env: Mapping[str, str]) -> Found:
    world, rank = env_int(env, "WORLD_SIZE", minimum=1), env_int(env, "RANK")
    if world is None or rank is None:
        have, missing = ("WORLD_SIZE", "RANK") if world is not None else ("RANK", "WORLD_SIZE")
        raise TopologyError(
            f"{have}={get_var(env, have)} is set but {missing} is not: set both (WORLD_SIZE = node count, "
            f"RANK = this node's rank), unset {have}, or pass --num-nodes and --node-rank"
        )
    addr = get_var(env, "MASTER_ADDR")
    return Found(
        source=SOURCE_CLOUD,
        num=world,
        num_from=f"WORLD_SIZE={world}",
        rank=rank,
        rank_from=f"RANK={rank}",
        addr=addr,
        addr_from="MASTER_ADDR",
        port=env_int(env, "MASTER_PORT", port=True),
        job_id=job_from_host(addr),
    )


def _from_slurm(env: Mapping[str, str], nodes_var: str, given: set[str]) -> Found | None:
    num = env_int(env, nodes_var, minimum=1)
    rank = env_int(env, "SLURM_NODEID")
    if num == 1 and rank is None:
        return None  # a one-node allocation outside a job step: nothing to coordinate
    if rank is None and "rank" not in given:
        raise TopologyError(
            f"SLURM reports {num} nodes but SLURM_NODEID is not set: start taehv-launch once per node "
            "with `srun --ntasks-per-node=1 taehv-launch ...`"
        )
    addr, addr_from = get_var(env, "MASTER_ADDR"), "MASTER_ADDR"
    if not addr and num > 1 and "addr" not in given:
        nodelist_var = first_set(env, "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
        if nodelist_var is None:
            raise TopologyError(f"SLURM reports {num} nodes but no node list: set MASTER_ADDR or pass --master-addr")
        addr, addr_from = slurm_first_host(get_var(env, nodelist_var)), f"the first host of {nodelist_var}"
    return Found(
        source=SOURCE_SLURM,
        num=num,
        num_from=f"{nodes_var}={num}",
        rank=rank,
        rank_from=f"SLURM_NODEID={rank}",
        addr=addr,
        addr_from=addr_from,
        port=env_int(env, "MASTER_PORT", port=True),
        job_id=get_var(env, "SLURM_JOB_ID"),
    )


def _from_kubernetes(env: Mapping[str, str], given: set[str]) -> Found:
    rank = env_int(env, "JOB_COMPLETION_INDEX")
    nodes_var = "NNODES" if get_var(env, "NNODES") else "NUM_NODES"
    num = env_int(env, nodes_var, minimum=1)
    if num is None and "num" not in given:
        raise TopologyError(
            f"Kubernetes indexed Job (JOB_COMPLETION_INDEX={rank}) but no node count: set NNODES in the "
            "Job's env to its completions (= parallelism), or pass --num-nodes"
        )
    addr = get_var(env, "MASTER_ADDR")
    if not addr and (num or 0) > 1 and "addr" not in given:
        raise TopologyError(
            "Kubernetes indexed Job but MASTER_ADDR is not set: create a headless Service for the Job and set "
            "MASTER_ADDR=<job>-0.<service> (the index-0 pod), or pass --master-addr"
        )
    job = get_var(env, "JOB_NAME")
    host = get_var(env, "HOSTNAME")
    if not job and host and rank is not None and host.endswith(f"-{rank}"):
        job = host[: -len(f"-{rank}")]
    return Found(
        source=SOURCE_KUBERNETES,
        num=num,
        num_from=f"{nodes_var}={num}",
        rank=rank,
        rank_from=f"JOB_COMPLETION_INDEX={rank}",
        addr=addr,
        addr_from="MASTER_ADDR",
        port=env_int(env, "MASTER_PORT", port=True),
        job_id=job or None,
    )


def _from_skypilot(env: Mapping[str, str], given: set[str]) -> Found:
    num = env_int(env, "SKYPILOT_NUM_NODES", minimum=1)
    rank = env_int(env, "SKYPILOT_NODE_RANK")
    if rank is None and "rank" not in given and num > 1:
        raise TopologyError("SKYPILOT_NUM_NODES is set but SKYPILOT_NODE_RANK is not: pass --node-rank")
    ips = (get_var(env, "SKYPILOT_NODE_IPS") or "").split()
    return Found(
        source=SOURCE_SKYPILOT,
        num=num,
        num_from=f"SKYPILOT_NUM_NODES={num}",
        rank=rank,
        rank_from=f"SKYPILOT_NODE_RANK={rank}",
        addr=get_var(env, "MASTER_ADDR") or (ips[0] if ips else None),
        addr_from="MASTER_ADDR" if get_var(env, "MASTER_ADDR") else "the first address of SKYPILOT_NODE_IPS",
        port=env_int(env, "MASTER_PORT", port=True),
        job_id=get_var(env, "SKYPILOT_TASK_ID"),
    )


# --- helpers -------------------------------------------------------------------------------


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


def job_from_host(addr: str | None) -> str | None:
    match = _REPLICA_HOST.match(addr or "")
    return match["job"] if match else None


def first_set(env: Mapping[str, str], *names: str) -> str | None:
    """The first of `names` that is set (not empty) in `env`."""
    return next((name for name in names if get_var(env, name)), None)


def get_var(env: Mapping[str, str], name: str) -> str | None:
    """The stripped value of `name`; None when unset or empty."""
    value = env.get(name)
    value = value.strip() if value is not None else None
    return value or None


def env_int(env: Mapping[str, str], name: str, *, minimum: int = 0, port: bool = False) -> int | None:
    raw = get_var(env, name)
    if raw is None:
        return None
    value = parse_int(name, raw, raw, minimum=minimum)
    if port:
        check_port(value, f"{name}={raw}")
    return value


def parse_int(name: str, raw: str, text: str, *, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TopologyError(f"{name}={raw!r} is not an integer: fix or unset {name}") from None
    if value < minimum:
        raise TopologyError(f"{name}={raw!r} must be at least {minimum}: fix or unset {name}")
    return value


# RFC 1123 section 2.1, plus '_' inside a label: Docker Compose services and some cluster hosts are
# named node_07, and glibc's resolver and torch's rendezvous take such names.
_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?$")


def check_host(addr: str, origin: str) -> None:
    """The rendezvous address is a hostname (RFC 1123: dot-separated labels of letters, digits and
    inner hyphens or underscores, 1-63 characters each, 253 in all; a trailing dot allowed), an IPv4 address or an
    IPv6 address (bare or in brackets), else TopologyError in one line naming where it came from
    (`origin`: --master-addr, MASTER_ADDR, ...).
    All-numeric dotted names must be a valid IPv4 address (RFC 1123: a hostname's top label is never
    all digits), so `10.0.0.256` is refused rather than looked up as a name."""
    import ipaddress

    bare = addr[1:-1] if addr.startswith("[") and addr.endswith("]") else addr
    try:
        ipaddress.ip_address(bare)
        return
    except ValueError:
        pass
    name = addr[:-1] if addr.endswith(".") else addr
    labels = name.split(".")
    numeric = all(part.isdigit() for part in labels)
    if not numeric and len(name) <= 253 and all(_LABEL.match(part) for part in labels):
        return
    raise TopologyError(
        f"{origin} {addr!r} is not a hostname or IP address: give node 0's address as a hostname (letters, digits, "
        f"'-', '_' and '.', RFC 1123), an IPv4 address (10.0.0.1) or an IPv6 address (fd00::1)"
    )


def check_port(port: int, label: str) -> None:
    if not 1 <= port <= 65535:
        raise TopologyError(f"{label} is not a port: use 1-65535 (29500 is the usual one)")
