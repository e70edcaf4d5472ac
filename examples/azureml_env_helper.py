#!/usr/bin/env python3
"""The Azure ML guides' own environment helper for `type: mpi` jobs (how-to-train-distributed-gpu,
"set_environment_variables_for_nccl_backend"), as users copy it into their scripts: it maps Open
MPI's OMPI_COMM_WORLD_* and Azure's AZ_BATCH_MASTER_NODE to what torch.distributed reads. It
knows Open MPI only. On an Intel MPI image (Hydra sets PMI_RANK, MPI_LOCALRANKID) the guide's
copy dies with `KeyError: 'OMPI_COMM_WORLD_RANK'`; this one stops with the fix instead.

    import azureml_env_helper; azureml_env_helper.set_environment_variables_for_nccl_backend()
    mpirun ... python azureml_env_helper.py python train.py      # the same, then run the command
"""

import os
import sys

# Open MPI's variables, in the order the guide reads them
OPEN_MPI = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")


class NotOpenMPI(RuntimeError):
    pass


def _other_launcher() -> str:
    if "PMI_RANK" in os.environ or "MPI_LOCALRANKID" in os.environ:
        return f"Intel MPI / MPICH (Hydra: PMI_RANK={os.environ.get('PMI_RANK', '?')})"
    if "SLURM_PROCID" in os.environ:
        return f"Slurm (SLURM_PROCID={os.environ['SLURM_PROCID']})"
    if "RANK" in os.environ:
        return f"a launcher that already set RANK={os.environ['RANK']} (torchrun, Azure ML type: pytorch)"
    return "no MPI launcher at all"


def set_environment_variables_for_nccl_backend(single_node: bool = False, master_port: int = 6105) -> None:
    missing = [v for v in OPEN_MPI if v not in os.environ]
    if missing:
        raise NotOpenMPI(
            f"the Azure ML guides' helper reads Open MPI's {', '.join(missing)}, which this process does not have: "
            f"it was started by {_other_launcher()}. Use the image's launch contract instead, which reads every "
            "launcher's variables: run `tb-launch python train.py`, or call `import trainbase_launch; "
            "trainbase_launch.apply()` before init_process_group"
        )
    os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
    os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    if not single_node:
        os.environ["MASTER_ADDR"] = os.environ["AZ_BATCH_MASTER_NODE"].split(":")[0]
        # the guide keeps a MASTER_PORT the job set, and never takes AZ_BATCH_MASTER_NODE's port
        # (Batch reserves it for its own use)
        os.environ.setdefault("MASTER_PORT", str(master_port))
    else:
        os.environ["MASTER_ADDR"] = os.environ["AZ_BATCHAI_MPI_MASTER_NODE"]
        os.environ["MASTER_PORT"] = "54965"
    os.environ["LOCAL_RANK"] = os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]
    os.environ["NCCL_SOCKET_IFNAME"] = "^docker0,lo"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        set_environment_variables_for_nccl_backend(
            single_node=int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", 0))
            == int(os.environ.get("OMPI_COMM_WORLD_SIZE", -1))
        )
    except NotOpenMPI as e:
        print(f"azureml_env_helper: {e}", file=sys.stderr)
        return 2
    os.execvp(argv[0], argv)  # noqa: S606 -- becomes the user's command (the helper's purpose)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
