"""Topology detection: every scheduler source, precedence, GPU-count cross-checks, messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from taehv_launch.errors import TopologyError, UserError
from taehv_launch.plan.schedulers import (
    SOURCE_ASSUMED,
    SOURCE_CLOUD,
    SOURCE_KUBERNETES,
    SOURCE_OPTIONS,
    SOURCE_PET,
    SOURCE_SINGLE,
    SOURCE_SKYPILOT,
    SOURCE_SLURM,
    slurm_first_host,
)
from taehv_launch.plan.topology import (
    Topology,
    check_local_gpus,
    detect_topology,
    listed_gpus,
)
from conftest import overrides

EIGHT = "0,1,2,3,4,5,6,7"

# Realistic environments, one node's view (the rank is filled in per test).
# PAI-DLC / Volcano / the seeds' platform: WORLD_SIZE = nodes, RANK = node rank.
CLOUD = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "jo-dbxfe2k2l635222i-worker-0", "MASTER_PORT": "23456"}
# sbatch --nodes=2 --ntasks-per-node=1, then `srun taehv-launch 16 h100`.
SLURM = {
    "SLURM_JOB_ID": "481516",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_JOB_NODELIST": "gpu-node[07-08]",
    "SLURM_NODELIST": "gpu-node[07-08]",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "gpu-node[07-08]",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
}
# Kubeflow training-operator PyTorchJob with nprocPerNode: 8 (master + 1 worker): note
# WORLD_SIZE is the *process* count there.
KUBEFLOW = {
    "PET_NNODES": "2",
    "PET_NODE_RANK": "0",
    "PET_NPROC_PER_NODE": "8",
    "WORLD_SIZE": "16",
    "RANK": "0",
    "MASTER_ADDR": "taehv-16-master-0",
    "MASTER_PORT": "23456",
}
# Kubeflow Trainer v2 TrainJob (JobSet of indexed Jobs).
TRAINJOB = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "8",
    "PET_NODE_RANK": "0",
    "PET_MASTER_ADDR": "taehv-16-node-0-0.taehv-16",
    "PET_MASTER_PORT": "29400",
    "JOB_COMPLETION_INDEX": "0",
}
# Plain Kubernetes indexed Job with a headless Service, NNODES set in the pod spec.
K8S = {
    "JOB_COMPLETION_INDEX": "0",
    "NNODES": "2",
    "MASTER_ADDR": "taehv-train-0.taehv-svc",
    "HOSTNAME": "taehv-train-0",
}
SKYPILOT = {
    "SKYPILOT_NUM_NODES": "2",
    "SKYPILOT_NODE_RANK": "0",
    "SKYPILOT_NODE_IPS": "10.0.0.11\n10.0.0.12\n",
    "SKYPILOT_NUM_GPUS_PER_NODE": "8",
    "SKYPILOT_TASK_ID": "sky-2026-01-01-00-00-00-000000_taehv_1",
}


def with_rank(env: dict, **changes: str) -> dict:
    return {**env, **changes}


# --- single node ------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [1, 2, 3, 5, 8])
def test_single_node_without_scheduler(gpus):
    topo = detect_topology(gpus, {})
    assert (topo.num_machines, topo.machine_rank, topo.gpus_per_machine) == (1, 0, gpus)
    assert topo.main_process_ip == "127.0.0.1"
    assert topo.main_process_port == 29500
    assert topo.source == SOURCE_SINGLE
    assert topo.job_id is None
    assert topo.world_size == gpus
    assert topo.gpu_ids == ",".join(str(i) for i in range(gpus))


def test_single_node_honours_master_port_and_options():
    assert detect_topology(8, {"MASTER_PORT": "29600"}).main_process_port == 29600
    topo = detect_topology(8, {"MASTER_PORT": "29600"}, master_port=29700, master_addr="10.1.1.1")
    assert (topo.main_process_ip, topo.main_process_port) == ("10.1.1.1", 29700)
    assert detect_topology(4, {}, default_port=12345).main_process_port == 12345


def test_single_node_ignores_a_stray_master_addr():
    assert detect_topology(8, {"MASTER_ADDR": "somewhere"}).main_process_ip == "127.0.0.1"


def test_single_node_job_id_from_a_one_node_slurm_allocation():
    env = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "gpu01"}
    topo = detect_topology(8, env)
    assert topo.source == SOURCE_SINGLE
    assert topo.job_id == "77"


def test_single_node_gpus_per_node_must_match():
    assert detect_topology(8, {}, gpus_per_node=8).gpus_per_machine == 8
    with pytest.raises(
        TopologyError, match=r"4 GPUs on 1 node .* do not match --gpus-per-node 8: drop --gpus-per-node"
    ):
        detect_topology(4, {}, gpus_per_node=8)


@pytest.mark.parametrize(("gpus", "nodes"), [(16, 2), (48, 6), (64, 8)])
def test_more_gpus_than_one_node_without_scheduler_is_shown_as_nodes(gpus, nodes):
    topo = detect_topology(gpus, {})
    assert (topo.num_machines, topo.machine_rank, topo.gpus_per_machine) == (nodes, 0, 8)
    assert topo.main_process_ip == "127.0.0.1"
    assert topo.source == SOURCE_ASSUMED
    assert topo.gpu_ids == EIGHT
    # ... but it cannot be launched as is.
    expected = rf"{gpus} GPUs need {nodes} nodes of 8 but no scheduler was detected: .*--node-rank R --master-addr ADDR"
    with pytest.raises(TopologyError, match=expected):
        check_local_gpus(topo, 8)


def test_more_gpus_than_one_node_must_be_whole_nodes():
    with pytest.raises(
        TopologyError, match=r"12 GPUs .* not a whole number of nodes: ask for 8 or 16 GPUs, or pass --gpus-per-node"
    ):
        detect_topology(12, {})
    topo = detect_topology(12, {}, gpus_per_node=4)
    assert (topo.num_machines, topo.gpus_per_machine, topo.source) == (3, 4, SOURCE_ASSUMED)


def test_manual_multi_node_with_node_rank_only():
    topo = detect_topology(16, {}, node_rank=1, master_addr="node0")
    assert (topo.num_machines, topo.machine_rank, topo.gpus_per_machine) == (2, 1, 8)
    assert topo.source == SOURCE_OPTIONS
    check_local_gpus(topo, 8)


# --- cloud (WORLD_SIZE = nodes, RANK = node rank) ------------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_cloud_two_nodes(rank):
    topo = detect_topology(16, with_rank(CLOUD, RANK=str(rank)), profile="h100")
    assert (topo.num_machines, topo.machine_rank, topo.gpus_per_machine) == (2, rank, 8)
    assert topo.gpu_ids == EIGHT  # local ids on both nodes, never 0-15
    assert topo.world_size == 16
    assert (topo.main_process_ip, topo.main_process_port) == ("jo-dbxfe2k2l635222i-worker-0", 23456)
    assert topo.source == SOURCE_CLOUD
    assert topo.job_id == "jo-dbxfe2k2l635222i"


@pytest.mark.parametrize(("gpus", "nodes"), [(48, 6), (64, 8)])
def test_cloud_many_nodes(gpus, nodes):
    env = {"WORLD_SIZE": str(nodes), "RANK": str(nodes - 1), "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    topo = detect_topology(gpus, env)
    assert (topo.num_machines, topo.machine_rank, topo.gpus_per_machine) == (nodes, nodes - 1, 8)
    assert topo.gpu_ids == EIGHT
    assert topo.job_id is None  # an IP is not a job name


def test_cloud_pai_dlc_job_id():
    env = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "dlc18isgeaydabcd-master-0", "MASTER_PORT": "23456"}
    assert detect_topology(16, env).job_id == "dlc18isgeaydabcd"


def test_seeds_workaround_8_gpus_on_each_of_2_nodes_is_refused():
    # seeds/003: `WORLD_SIZE=2 RANK=r ./train_taehv_h100.sh 8 h100` on each node.
    with pytest.raises(
        TopologyError,
        match=r"^8 GPUs cannot be split over 2 nodes \(WORLD_SIZE=2\) x 8 GPUs per node \(= 16\): "
        r"run `taehv-launch 16 h100` on each node, pass --gpus-per-node 4, or run on 1 node$",
    ):
        detect_topology(8, CLOUD, profile="h100")


def test_gpus_per_node_4_splits_8_gpus_over_2_nodes():
    topo = detect_topology(8, with_rank(CLOUD, RANK="1"), gpus_per_node=4)
    assert (topo.num_machines, topo.machine_rank, topo.gpus_per_machine) == (2, 1, 4)
    assert topo.gpu_ids == "0,1,2,3"
    check_local_gpus(topo, 8)  # using 4 of 8 GPUs is fine


def test_cloud_one_node():
    topo = detect_topology(8, {"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "job-master-0"})
    assert (topo.num_machines, topo.gpus_per_machine, topo.main_process_ip) == (1, 8, "127.0.0.1")
    assert topo.source == SOURCE_CLOUD


def test_cloud_half_set_is_refused():
    with pytest.raises(TopologyError, match=r"WORLD_SIZE=2 is set but RANK is not: set both"):
        detect_topology(16, {"WORLD_SIZE": "2", "MASTER_ADDR": "x"})
    with pytest.raises(TopologyError, match=r"RANK=1 is set but WORLD_SIZE is not"):
        detect_topology(16, {"RANK": "1"})


def test_cloud_multi_node_needs_master_addr():
    with pytest.raises(TopologyError, match=r"no address for the main node: pass --master-addr .* or set MASTER_ADDR"):
        detect_topology(16, {"WORLD_SIZE": "2", "RANK": "1"})
    assert detect_topology(16, {"WORLD_SIZE": "2", "RANK": "1"}, master_addr="n0").main_process_ip == "n0"


def test_process_count_in_world_size_is_explained():
    # WORLD_SIZE=16 (torchrun's meaning) read as 16 nodes: the message names the variable.
    with pytest.raises(TopologyError, match=r"16 GPUs cannot be split over 16 nodes \(WORLD_SIZE=16\)"):
        detect_topology(16, {"WORLD_SIZE": "16", "RANK": "0", "MASTER_ADDR": "x"})


# --- SLURM ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_slurm_two_nodes(rank):
    topo = detect_topology(16, with_rank(SLURM, SLURM_NODEID=str(rank), SLURM_PROCID=str(rank)))
    assert (topo.num_machines, topo.machine_rank, topo.gpus_per_machine) == (2, rank, 8)
    assert topo.gpu_ids == EIGHT
    assert (topo.main_process_ip, topo.main_process_port) == ("gpu-node07", 29500)
    assert topo.source == SOURCE_SLURM
    assert topo.job_id == "481516"


def test_slurm_batch_script_variables_only():
    env = {"SLURM_JOB_ID": "9", "SLURM_NNODES": "8", "SLURM_NODEID": "3", "SLURM_JOB_NODELIST": "n[1-8]"}
    topo = detect_topology(64, env)
    assert (topo.num_machines, topo.machine_rank, topo.main_process_ip) == (8, 3, "n1")


def test_slurm_master_addr_and_port_override():
    topo = detect_topology(16, with_rank(SLURM, MASTER_ADDR="10.9.9.9", MASTER_PORT="29555"))
    assert (topo.main_process_ip, topo.main_process_port) == ("10.9.9.9", 29555)


def test_slurm_job_num_nodes_fallback():
    env = {"SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "a,b"}
    topo = detect_topology(16, env)
    assert (topo.num_machines, topo.machine_rank, topo.main_process_ip, topo.source) == (2, 1, "a", SOURCE_SLURM)


def test_slurm_one_node_with_nodeid_is_slurm_single_node():
    env = {"SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "g1"}
    topo = detect_topology(8, env)
    assert (topo.num_machines, topo.gpus_per_machine, topo.main_process_ip) == (1, 8, "127.0.0.1")
    assert topo.source == SOURCE_SLURM


def test_slurm_multi_node_without_nodeid_asks_for_srun():
    with pytest.raises(
        TopologyError, match=r"SLURM reports 2 nodes but SLURM_NODEID is not set: .*srun --ntasks-per-node=1"
    ):
        detect_topology(16, {"SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"})


def test_slurm_several_tasks_per_node_is_refused():
    env = with_rank(SLURM, SLURM_STEP_NUM_TASKS="16")
    with pytest.raises(TopologyError, match=r"srun started 16 tasks on 2 nodes.*--ntasks-per-node=1"):
        detect_topology(16, env)


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("node[01-04,07]", "node01"),
        ("node[07,01-04]", "node07"),
        ("gpu-a[1-2],gpu-b3", "gpu-a1"),
        ("n1,n2", "n1"),
        ("host", "host"),
        ("host.cluster.local", "host.cluster.local"),
        ("rack[2-3]-node[009-012]", "rack2-node009"),
        ("gpu-b3,gpu-a[1-2]", "gpu-b3"),
    ],
)
def test_slurm_first_host(nodelist, first):
    assert slurm_first_host(nodelist) == first


def test_slurm_first_host_unreadable():
    with pytest.raises(TopologyError, match="set MASTER_ADDR"):
        slurm_first_host("node[01-04")


# --- torchrun-style PET_* (Kubeflow) ------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_kubeflow_pytorchjob_pet_wins_over_world_size(rank):
    env = with_rank(KUBEFLOW, PET_NODE_RANK=str(rank), RANK=str(rank))
    if rank:
        env["MASTER_ADDR"] = "taehv-16-master-0"
    topo = detect_topology(16, env)
    assert (topo.num_machines, topo.machine_rank, topo.gpus_per_machine) == (2, rank, 8)
    assert (topo.main_process_ip, topo.main_process_port) == ("taehv-16-master-0", 23456)
    assert topo.source == SOURCE_PET
    assert topo.job_id == "taehv-16"


def test_kubeflow_trainjob():
    topo = detect_topology(16, with_rank(TRAINJOB, PET_NODE_RANK="1", JOB_COMPLETION_INDEX="1"))
    assert (topo.num_machines, topo.machine_rank) == (2, 1)
    assert (topo.main_process_ip, topo.main_process_port) == ("taehv-16-node-0-0.taehv-16", 29400)
    assert topo.source == SOURCE_PET  # PET_* wins over JOB_COMPLETION_INDEX
    assert topo.job_id == "taehv-16"


def test_pet_fixed_range_is_accepted():
    topo = detect_topology(16, with_rank(TRAINJOB, PET_NNODES="2:2"))
    assert topo.num_machines == 2


def test_pet_elastic_range_is_refused():
    with pytest.raises(TopologyError, match=r"PET_NNODES='1:2' is an elastic node range, which is not supported"):
        detect_topology(16, with_rank(TRAINJOB, PET_NNODES="1:2"))


def test_pet_without_node_rank():
    env = {k: v for k, v in TRAINJOB.items() if k != "PET_NODE_RANK"}
    with pytest.raises(TopologyError, match="PET_NODE_RANK is not: pass --node-rank"):
        detect_topology(16, env)
    assert detect_topology(16, env, node_rank=1).machine_rank == 1


# --- Kubernetes indexed Jobs -------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_kubernetes_indexed_job(rank):
    env = with_rank(K8S, JOB_COMPLETION_INDEX=str(rank), HOSTNAME=f"taehv-train-{rank}")
    topo = detect_topology(16, env)
    assert (topo.num_machines, topo.machine_rank, topo.gpus_per_machine) == (2, rank, 8)
    assert topo.main_process_ip == "taehv-train-0.taehv-svc"
    assert topo.source == SOURCE_KUBERNETES
    assert topo.job_id == "taehv-train"


def test_kubernetes_num_nodes_and_job_name():
    env = {"JOB_COMPLETION_INDEX": "5", "NUM_NODES": "6", "MASTER_ADDR": "m", "JOB_NAME": "taehv-48"}
    topo = detect_topology(48, env)
    assert (topo.num_machines, topo.machine_rank, topo.job_id) == (6, 5, "taehv-48")


def test_kubernetes_needs_node_count():
    env = {"JOB_COMPLETION_INDEX": "1", "MASTER_ADDR": "m"}
    with pytest.raises(TopologyError, match=r"no node count: set NNODES .* or pass --num-nodes"):
        detect_topology(16, env)
    topo = detect_topology(16, env, num_nodes=2)
    assert (topo.num_machines, topo.machine_rank, topo.source) == (2, 1, SOURCE_OPTIONS)


def test_kubernetes_needs_master_addr():
    with pytest.raises(TopologyError, match=r"MASTER_ADDR is not set: create a headless Service"):
        detect_topology(16, {"JOB_COMPLETION_INDEX": "1", "NNODES": "2"})


# --- SkyPilot ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_skypilot(rank):
    topo = detect_topology(16, with_rank(SKYPILOT, SKYPILOT_NODE_RANK=str(rank)))
    assert (topo.num_machines, topo.machine_rank, topo.gpus_per_machine) == (2, rank, 8)
    assert (topo.main_process_ip, topo.main_process_port) == ("10.0.0.11", 29500)
    assert topo.source == SOURCE_SKYPILOT
    assert topo.job_id == SKYPILOT["SKYPILOT_TASK_ID"]


def test_skypilot_single_node():
    env = {"SKYPILOT_NUM_NODES": "1", "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "10.0.0.11"}
    topo = detect_topology(8, env)
    assert (topo.num_machines, topo.main_process_ip, topo.source) == (1, "127.0.0.1", SOURCE_SKYPILOT)


# --- precedence ------------------------------------------------------------------------------


def test_options_win_over_environment():
    topo = detect_topology(32, CLOUD, num_nodes=4, node_rank=3, master_addr="10.0.0.1", master_port=30000)
    assert (topo.num_machines, topo.machine_rank, topo.main_process_ip, topo.main_process_port) == (
        4,
        3,
        "10.0.0.1",
        30000,
    )
    assert topo.source == SOURCE_OPTIONS


def test_explicit_num_nodes_and_rank_skip_scheduler_variables():
    # A broken scheduler variable does not matter when both are given; MASTER_ADDR is still read.
    env = {"PET_NNODES": "1:4", "MASTER_ADDR": "head", "SLURM_JOB_ID": "12"}
    topo = detect_topology(16, env, num_nodes=2, node_rank=0)
    assert (topo.num_machines, topo.main_process_ip, topo.job_id, topo.source) == (2, "head", "12", SOURCE_OPTIONS)


def test_single_option_overrides_one_field():
    topo = detect_topology(16, with_rank(CLOUD, RANK="1"), master_addr="10.2.2.2")
    assert (topo.machine_rank, topo.main_process_ip, topo.source) == (1, "10.2.2.2", SOURCE_CLOUD)
    topo = detect_topology(16, with_rank(CLOUD, RANK="1"), node_rank=0)
    assert (topo.machine_rank, topo.source) == (0, SOURCE_OPTIONS)


def test_num_nodes_1_ignores_scheduler_rank():
    topo = detect_topology(8, with_rank(CLOUD, RANK="1"), num_nodes=1)
    assert (topo.num_machines, topo.machine_rank, topo.main_process_ip) == (1, 0, "127.0.0.1")


def test_explicit_num_nodes_needs_rank_and_address():
    with pytest.raises(TopologyError, match=r"no node rank: pass --node-rank"):
        detect_topology(16, {}, num_nodes=2)
    with pytest.raises(TopologyError, match=r"no address for the main node"):
        detect_topology(16, {}, num_nodes=2, node_rank=1)


def test_cloud_wins_over_slurm():
    env = {**SLURM, **with_rank(CLOUD, RANK="1")}
    topo = detect_topology(16, env)
    assert (topo.source, topo.machine_rank, topo.main_process_ip) == (SOURCE_CLOUD, 1, CLOUD["MASTER_ADDR"])
    assert topo.job_id == "jo-dbxfe2k2l635222i"


def test_slurm_wins_over_kubernetes_and_skypilot():
    env = {**SKYPILOT, **K8S, **with_rank(SLURM, SLURM_NODEID="1")}
    env.pop("MASTER_ADDR")
    topo = detect_topology(16, env)
    assert (topo.source, topo.machine_rank, topo.main_process_ip) == (SOURCE_SLURM, 1, "gpu-node07")


def test_kubernetes_wins_over_skypilot():
    env = {**SKYPILOT, **with_rank(K8S, JOB_COMPLETION_INDEX="1")}
    assert detect_topology(16, env).source == SOURCE_KUBERNETES


def test_gpus_per_node_option_with_detected_nodes():
    topo = detect_topology(32, {"WORLD_SIZE": "4", "RANK": "2", "MASTER_ADDR": "m"}, gpus_per_node=8)
    assert (topo.num_machines, topo.gpus_per_machine) == (4, 8)
    expected = (
        r"32 GPUs cannot be split over 4 nodes \(WORLD_SIZE=4\) x 4 GPUs per node \(= 16\): "
        r"run `taehv-launch 16 PROFILE` on each node, pass --gpus-per-node 8, or run on 8 nodes$"
    )
    with pytest.raises(TopologyError, match=expected):
        detect_topology(32, {"WORLD_SIZE": "4", "RANK": "2", "MASTER_ADDR": "m"}, gpus_per_node=4)


# --- inside torchrun, bad values ---------------------------------------------------------------


@pytest.mark.parametrize("var", ["LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"])
def test_inside_torchrun_is_refused(var):
    env = {"WORLD_SIZE": "16", "RANK": "3", "MASTER_ADDR": "m", var: "3"}
    with pytest.raises(
        TopologyError, match=rf"running under torchrun or accelerate launch \({var}=3 is set\): start it directly"
    ):
        detect_topology(16, env)
    with pytest.raises(TopologyError, match="under torchrun"):
        detect_topology(16, env, num_nodes=2, node_rank=0, master_addr="m")


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"WORLD_SIZE": "two", "RANK": "0"}, r"WORLD_SIZE='two' is not an integer: fix or unset WORLD_SIZE"),
        ({"WORLD_SIZE": "2", "RANK": "1.0"}, r"RANK='1.0' is not an integer"),
        ({"WORLD_SIZE": "0", "RANK": "0"}, r"WORLD_SIZE='0' must be at least 1"),
        ({"WORLD_SIZE": "2", "RANK": "-1"}, r"RANK='-1' must be at least 0"),
        (
            {"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "m"},
            r"node rank 2 \(RANK=2\) is outside 0..1 for 2 nodes \(WORLD_SIZE=2\)",
        ),
        ({"MASTER_PORT": "http"}, r"MASTER_PORT='http' is not an integer"),
        ({"MASTER_PORT": "70000"}, r"MASTER_PORT=70000 is not a port: use 1-65535"),
        ({"SLURM_NNODES": "x", "SLURM_NODEID": "0"}, r"SLURM_NNODES='x' is not an integer"),
        ({"PET_NNODES": "2:x"}, r"PET_NNODES='2:x' is not an integer"),
        (
            {"JOB_COMPLETION_INDEX": "a", "NNODES": "2", "MASTER_ADDR": "m"},
            r"JOB_COMPLETION_INDEX='a' is not an integer",
        ),
        ({"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "?"}, r"SKYPILOT_NODE_RANK='\?' is not an integer"),
    ],
)
def test_bad_values_name_the_variable(env, match):
    with pytest.raises(TopologyError, match=match):
        detect_topology(16, env)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_nodes": 0}, r"--num-nodes must be at least 1, got 0"),
        ({"node_rank": -1}, r"--node-rank must be 0 or more"),
        ({"gpus_per_node": 0}, r"--gpus-per-node must be at least 1"),
        ({"master_port": 0}, r"--master-port 0 is not a port"),
        ({"num_nodes": 2, "node_rank": 2, "master_addr": "m"}, r"node rank 2 \(--node-rank\) is outside 0..1"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(TopologyError, match=match):
        detect_topology(16, {}, **kwargs)


def test_bad_gpu_count():
    with pytest.raises(TopologyError, match="at least 1"):
        detect_topology(0, {})


def test_empty_variables_count_as_unset():
    topo = detect_topology(8, {"WORLD_SIZE": "", "RANK": " ", "SLURM_NNODES": ""})
    assert topo.source == SOURCE_SINGLE


def test_errors_are_one_line_user_errors():
    with pytest.raises(UserError) as info:
        detect_topology(8, CLOUD, profile="h100")
    assert "\n" not in str(info.value)
    assert info.value.exit_code == 2


# --- check_local_gpus ------------------------------------------------------------------------


def test_check_local_gpus_fewer_than_visible_is_fine():
    check_local_gpus(detect_topology(1, {}), 8)
    check_local_gpus(detect_topology(8, {}), 8)
    check_local_gpus(detect_topology(16, with_rank(CLOUD, RANK="1")), 8)


def test_check_local_gpus_no_gpu():
    with pytest.raises(
        TopologyError, match=r"no GPU is visible on this node: .*CUDA_VISIBLE_DEVICES.*taehv-launch 1 cpu"
    ):
        check_local_gpus(detect_topology(1, {}), 0)


def test_check_local_gpus_single_node_too_few():
    topo = detect_topology(8, {"WORLD_SIZE": "1", "RANK": "0"})
    expected = (
        r"8 GPUs requested but this node sees 4 .*run `taehv-launch 4 h100`, run on 2 nodes, or check CUDA_VISIBLE"
    )
    with pytest.raises(TopologyError, match=expected):
        check_local_gpus(topo, 4, profile="h100")


def test_check_local_gpus_seeds_16_on_one_8_gpu_node():
    topo = detect_topology(16, {"SLURM_NNODES": "1", "SLURM_NODEID": "0"})
    assert topo.gpus_per_machine == 16
    with pytest.raises(TopologyError, match=r"16 GPUs requested but this node sees 8"):
        check_local_gpus(topo, 8)


def test_check_local_gpus_multi_node_too_few():
    topo = detect_topology(16, with_rank(CLOUD, RANK="1"))
    expected = r"2 nodes x 8 GPUs planned but node 1 sees 4: run `taehv-launch 8 h100 --gpus-per-node 4` on every node"
    with pytest.raises(TopologyError, match=expected):
        check_local_gpus(topo, 4, profile="h100")


# --- CUDA_VISIBLE_DEVICES, read without torch (the dry run and the launch) -------------------


@pytest.mark.parametrize(
    "value,count",
    [
        (None, None),
        ("", 0),
        ("-1", 0),
        ("3", 1),
        (EIGHT, 8),
        ("0, 1", 2),
        ("0,1,", 2),
        ("0,1,-1,2", 2),
        ("GPU-8a1b2c3d-aaaa,GPU-77", 2),
        ("MIG-GPU-8a1b/1/0", 1),
    ],
)
def test_listed_gpus(value, count):
    assert listed_gpus({} if value is None else {"CUDA_VISIBLE_DEVICES": value}) == count


@pytest.mark.parametrize(
    "value,match",
    [
        ("garbage", r"'garbage' is neither an index nor a GPU-/MIG- UUID"),
        ("0,,1", r"'' is neither"),
        ("0,gpu1", r"'gpu1' is neither"),
        ("1,01", r"lists GPU 01 twice"),
    ],
)
def test_listed_gpus_refuses_a_malformed_value(value, match):
    with pytest.raises(TopologyError, match=match):
        listed_gpus({"CUDA_VISIBLE_DEVICES": value})


@pytest.mark.slow
def test_the_dry_run_refuses_a_bad_cuda_visible_devices_as_the_launch_does(tmp_path):
    """`CUDA_VISIBLE_DEVICES=garbage taehv-launch 8 h100 --dry-run` showed "GPU ids 0..7" while the launch
    refused it (#29 item 9): now --dry-run, --dry-run --json and the launch give the same one line, exit 2,
    on this CPU-only machine (no torch in the check), and nothing is written."""
    from conftest import assert_one_line_error, clean_env, run_cli

    line = "CUDA_VISIBLE_DEVICES='garbage' is not a list of GPUs: 'garbage' is neither an index nor a GPU-/MIG- UUID"
    env = clean_env(CUDA_VISIBLE_DEVICES="garbage")
    procs = [
        run_cli("8", "h100", *extra, "--set", f"output_dir={tmp_path / 'out'}", env=env)
        for extra in (("--dry-run",), ("--dry-run", "--json"), ())
    ]
    for proc in procs:
        assert_one_line_error(proc, line)
        assert proc.stdout == ""
    assert len({proc.stderr for proc in procs}) == 1  # the very same line
    assert not (tmp_path / "out").exists()


def test_the_dry_run_checks_what_cuda_visible_devices_lists_against_the_plan():
    from conftest import assert_one_line_error, clean_env, run_cli_here

    proc = run_cli_here("8", "h100", "--dry-run", env=clean_env(CUDA_VISIBLE_DEVICES="0,1,2,3"))
    assert_one_line_error(proc, r"8 GPUs requested but this node sees 4: run `taehv-launch 4 h100`, run on 2 nodes")
    proc = run_cli_here("8", "h100", "--dry-run", env=clean_env(CUDA_VISIBLE_DEVICES=""))
    assert_one_line_error(proc, r"no GPU is visible on this node")
    # enough listed: shown; 16 GPUs = 2 nodes of 8, this node lists its 8
    proc = run_cli_here("16", "h100", "--dry-run", env=clean_env(CUDA_VISIBLE_DEVICES="4,5,6,7,0,1,2,3"))
    assert proc.returncode == 0 and "(GPU ids 0,1,2,3,4,5,6,7 = CUDA_VISIBLE_DEVICES 4,5,6,7,0,1,2,3)" in proc.stdout
    # unset (a CPU-only laptop planning a GPU run) and the cpu profile: nothing to check
    assert run_cli_here("8", "h100", "--dry-run").returncode == 0
    assert run_cli_here("1", "cpu", "--dry-run", env=clean_env(CUDA_VISIBLE_DEVICES="garbage")).returncode == 0


def test_render_for_other_machines_ignores_this_machines_cuda_visible_devices(tmp_path):
    from conftest import clean_env, run_cli_here

    proc = run_cli_here(
        "render",
        "slurm",
        "16",
        "h100",
        "--output-dir",
        str(tmp_path),
        *overrides("data_root=/d ref_vae_path=/v"),
        env=clean_env(CUDA_VISIBLE_DEVICES="garbage"),
    )
    assert proc.returncode == 0 and "#SBATCH" in proc.stdout, proc.stderr


# --- the dataclass ---------------------------------------------------------------------------


def test_topology_properties_and_validation():
    topo = Topology(
        num_machines=2,
        machine_rank=1,
        gpus_per_machine=8,
        main_process_ip="10.0.0.1",
        main_process_port=29500,
        source=SOURCE_OPTIONS,
        job_id=None,
    )
    assert topo.gpu_ids == EIGHT
    assert topo.world_size == 16
    assert "2 nodes x 8 GPUs = 16 processes, this is node 1" in topo.describe()
    with pytest.raises(TopologyError):
        Topology(
            num_machines=2,
            machine_rank=2,
            gpus_per_machine=8,
            main_process_ip="x",
            main_process_port=29500,
            source=SOURCE_OPTIONS,
        )
    with pytest.raises(TypeError):
        Topology(2, 0, 8, "x", 29500, SOURCE_OPTIONS, None)  # keyword-only


def test_module_does_not_import_torch():
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = "import taehv_launch.plan.topology, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def test_a_gpu_count_past_the_profiles_maximum_suggests_only_counts_it_takes():
    from conftest import assert_one_line_error, run_cli_here

    for count in ("65", "72", "1000001"):
        assert_one_line_error(run_cli_here(count, "h100", "--dry-run"), rf"supports at most 64 GPUs, got {count}$")
    with pytest.raises(TopologyError, match=r"ask for 63 GPUs, or pass --gpus-per-node"):
        detect_topology(64, {}, gpus_per_node=7, max_gpus=64)  # 70 would be past the maximum
    for count in ("0", "-1"):  # one line for both, wherever it is caught
        assert_one_line_error(
            run_cli_here(count, "h100", "--dry-run"), rf"^error: GPU count must be at least 1, got {count} \(usage:"
        )


# --- the rendezvous address (#35: `--master-addr 'bad host!'` passed the dry run, torchrun died) ---


@pytest.mark.parametrize(
    "addr",
    [
        "gpu-node07",
        "node_07",  # Docker Compose services and some cluster hosts; glibc and torch resolve them
        "taehv-16-node-0-0.taehv-16",
        "node0.cluster.local.",
        "10.0.0.11",
        "fd00::1",
        "[fd00::1]",
        "a" * 63,
    ],
)
def test_a_hostname_or_ip_is_taken_as_the_master_address(addr):
    topo = detect_topology(16, {}, num_nodes=2, node_rank=1, master_addr=addr)
    assert topo.main_process_ip == addr


@pytest.mark.parametrize(
    "addr",
    ["bad host!", "_node", "node_", "-node", "node-", "a..b", "10.0.0.256", "1.2.3", "a" * 64, f"{'a' * 60}." * 5],
)
def test_a_master_address_that_is_no_hostname_or_ip_is_refused(addr):
    with pytest.raises(TopologyError, match=r"^--master-addr '.*' is not a hostname or IP address: give node 0's"):
        detect_topology(16, {}, num_nodes=2, node_rank=1, master_addr=addr)
    with pytest.raises(TopologyError, match="not a hostname"):  # on one node too: accelerate is given it
        detect_topology(1, {}, master_addr=addr)


@pytest.mark.parametrize(
    "env,origin",
    [
        (with_rank(CLOUD, MASTER_ADDR="bad host"), "MASTER_ADDR"),
        (with_rank(TRAINJOB, PET_MASTER_ADDR="x!"), "PET_MASTER_ADDR"),
        (with_rank(K8S, MASTER_ADDR="svc/0"), "MASTER_ADDR"),
        (
            {**{k: v for k, v in SLURM.items() if "NODELIST" not in k}, "SLURM_NODELIST": "gpu!a[1-2]"},
            "the first host of SLURM_NODELIST",
        ),
        (with_rank(SKYPILOT, SKYPILOT_NODE_IPS="10.0.0.300\n10.0.0.12"), "the first address of SKYPILOT_NODE_IPS"),
    ],
)
def test_a_schedulers_bad_master_address_is_refused_naming_its_variable(env, origin):
    with pytest.raises(TopologyError, match=rf"^{origin} '.*' is not a hostname or IP address"):
        detect_topology(16, env)


def test_a_bad_master_address_is_one_line_in_the_dry_run_and_the_launch_writes_nothing(tmp_path):
    from conftest import assert_one_line_error, run_cli, run_cli_here

    args = ("1", "cpu", "--master-addr", "bad host!", "--set", f"output_dir='{tmp_path / 'out'}'")
    match = r"^error: --master-addr 'bad host!' is not a hostname or IP address"
    assert_one_line_error(run_cli_here(*args, "--dry-run"), match)
    assert_one_line_error(run_cli(*args, cwd=tmp_path), match)  # the real launch: refused in the plan
    assert not (tmp_path / "out").exists()
