#!/usr/bin/env python3
"""TensorFlow MultiWorkerMirroredStrategy across the workers TF_CONFIG describes: an all-reduce
of (worker rank + 1) checked on every worker, against the number of workers the job launched.

    mpirun -np 2 -H a:1,b:1 -x TRAINBASE_HOSTS=a,b tb-launch --tf python tf_multiworker.py
    python tf_multiworker.py --workers 4      # Azure ML `type: tensorflow` (Azure writes TF_CONFIG)
"""

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, help="workers the job launched (default: the launcher's world)")
    a = ap.parse_args(argv)
    import trainbase_launch

    # An existing TF_CONFIG (Azure ML's, or tb-launch --tf's) is kept and checked against the
    # launcher's variables (mpirun, Slurm, RANK/WORLD_SIZE, Azure's node count); without one it is
    # built from them. A worker handed a one-worker TF_CONFIG in a bigger job would otherwise
    # train alone, all-reduce its own value and print OK.
    try:
        world = trainbase_launch.apply(tf=True)
    except trainbase_launch.LaunchError as e:
        print(f"tf_multiworker: {e}", file=sys.stderr)
        return 2
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    n = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    expected = a.workers or world.world_size
    if n != expected:
        print(f"tf_multiworker: TF_CONFIG lists {n} worker(s) but the job launched {expected}", file=sys.stderr)
        return 2

    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
    )

    @tf.function
    def step():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(float(world.rank + 1)))

    result = strategy.experimental_local_results(strategy.run(step))[0].numpy()
    want = expected * (expected + 1) / 2
    assert result == want, f"worker {world.rank}: all_reduce gave {result}, expected {want}"
    os.write(
        1,
        (
            f"OK worker={world.rank} workers={n} allreduce={result:g} replicas={strategy.num_replicas_in_sync}" + "\n"
        ).encode(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
