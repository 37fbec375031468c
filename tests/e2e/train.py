"""A tiny elastic training script for the end-to-end tests and the demo.

Each worker all_reduces its global rank STEPS times over gloo (sleeping STEP_SECONDS between
steps, so that a test can kill an agent mid-training), checks every sum, and writes one JSON
line per worker to $RESULT_DIR/result-<bootstrap port>-<rank>.json at the end.
"""

import json
import os
import time
from datetime import timedelta

import tensorplay as tp
import tensorplay.distributed as dist

steps = int(os.environ.get("STEPS", "3"))
step_seconds = float(os.environ.get("STEP_SECONDS", "0"))
result_dir = os.environ.get("RESULT_DIR", ".")
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

# Where the others wait when a peer never comes: a test holds one agent's workers here (HOLD_BEFORE_INIT=1),
# so the others' workers sit in init_process_group until the process group timeout (30 min).
print(
    f"group_rank {os.environ['GROUP_RANK']} restart {restart}: init_process_group world {os.environ['WORLD_SIZE']}",
    flush=True,
)
while os.environ.get("HOLD_BEFORE_INIT") == "1":
    time.sleep(1)
# PG_TIMEOUT_SECONDS: the process group's timeout (the frameworks' default is 30 min). A collective
# whose peer went silent (a network partition) fails only then, and the agent restarts the workers.
timeout = os.environ.get("PG_TIMEOUT_SECONDS")
dist.init_process_group("gloo", **({"timeout": timedelta(seconds=float(timeout))} if timeout else {}))
rank, world_size = dist.get_rank(), dist.get_world_size()
expected = world_size * (world_size - 1) / 2
sums = []
for step in range(steps):
    value = tp.tensor([float(rank)])
    dist.all_reduce(value)
    sums.append(value.tolist()[0])
    if abs(sums[-1] - expected) > 1e-6:
        raise SystemExit(f"rank {rank}: all_reduce gave {sums[-1]}, expected {expected}")
    print(
        f"rank {rank}/{world_size} group_rank {os.environ['GROUP_RANK']} restart {restart} step {step}: sum {sums[-1]}",
        flush=True,
    )
    time.sleep(step_seconds)
dist.barrier()
result = {
    "rank": rank,
    "world_size": world_size,
    "group_rank": int(os.environ["GROUP_RANK"]),
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "restart": restart,
    "sums": sums,
    "expected": expected,
    "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    "finished_at": time.time(),
}
# The bootstrap store's port identifies the round: every worker of a round shares it.
with open(os.path.join(result_dir, f"result-{os.environ['MASTER_PORT']}-{rank}.json"), "w") as handle:
    json.dump(result, handle)
dist.destroy_process_group()
