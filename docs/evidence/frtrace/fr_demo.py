"""Flight-recorder dumps as the hang detector writes them: 2 ranks, 5 all-reduces, then rank 1 stops
joining; rank 0 waits in the 6th and dumps. MODE=missing: rank 1 leaves no dump (a frozen rank);
MODE=complete: it dumps too (without joining)."""
import datetime, os, sys, time
import torch
import torch.distributed as dist
sys.path.insert(0, "src")
from taehv_launch.compat import flight_recorder_dumps

backend, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
rank = int(os.environ["RANK"])
dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
kw = {}
if backend == "nccl":
    torch.cuda.set_device(dev)
    kw["device_id"] = dev
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60), **kw)
x = torch.ones(1024, device=dev)
for _ in range(5):
    dist.all_reduce(x)
if backend == "nccl":
    torch.cuda.synchronize()
dist.barrier() if backend != "nccl" else None
if rank == 1:
    if mode == "complete":
        time.sleep(3)
        for kind, d in flight_recorder_dumps().items():
            open(f"{out}/{kind}_trace_rank_{rank}", "wb").write(d)
    time.sleep(8)
    os._exit(0)
work = dist.all_reduce(x, async_op=True)  # rank 0 waits in it
time.sleep(3)
for kind, d in flight_recorder_dumps().items():
    open(f"{out}/{kind}_trace_rank_{rank}", "wb").write(d)
print("rank 0 dumped", sorted(os.listdir(out)), flush=True)
os._exit(0)
