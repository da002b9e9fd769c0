"""Two gloo ranks call the decorated test kernel on one key; rank 0 alone has a record in its
local store. Each rank writes its source and config to rank<N>.json in the given folder."""
import json
import os
import sys

import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, init: str, dbs: list, out: str) -> None:
    os.environ["KS_DATABASE_URL"] = dbs[rank]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    import torch
    from ks_at_helpers import accumulate, accumulate_kernel

    from kernelsearch.kernels.configs import canonical as config_dict

    accumulate(torch.randn(100))
    (source,) = accumulate_kernel.sources.values()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "source": source.value,
                   "config": config_dict(accumulate_kernel.best_config)}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    init, db0, db1, out = sys.argv[1:5]
    mp.spawn(rank_main, args=(init, [db0, db1], out), nprocs=2)
