"""Slurm's own formats, as its task environment gives them (stdlib only, like tb-launch):
hostlists (SLURM_JOB_NODELIST) and tasks-per-node specs (SLURM_STEP_TASKS_PER_NODE)."""

import re


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist: 'gpu[01-03,07],login1' -> gpu01 gpu02 gpu03 gpu07 login1."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", expr):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{str(i).zfill(len(lo))}{suffix}")
    return hosts


def slurm_tasks_per_node(env: dict) -> int:
    """Tasks on each node of the step ('2(x3)' = 2 on each of 3 nodes); ValueError when unset or uneven."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE")
    if not spec:
        raise ValueError("SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE is not set")
    counts = {int(m.group(1)) for m in re.finditer(r"(\d+)(?:\(x\d+\))?", spec)}
    if len(counts) != 1:
        raise ValueError(f"uneven tasks per node ({spec}): LOCAL_WORLD_SIZE differs between nodes")
    return counts.pop()
