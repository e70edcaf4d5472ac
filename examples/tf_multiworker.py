#!/usr/bin/env python3
"""TensorFlow MultiWorkerMirroredStrategy across workers described by TF_CONFIG (from
`tb-launch --tf`): an all-reduce of (task index + 1) checked on every worker.

    mpirun -np 2 -H a:1,b:1 -x TRAINBASE_HOSTS=a,b tb-launch --tf python tf_multiworker.py
"""
import json
import os
import sys

import tensorflow as tf


def main() -> int:
    if "TF_CONFIG" not in os.environ:
        import trainbase_launch
        trainbase_launch.apply(tf=True)
    cfg = json.loads(os.environ["TF_CONFIG"])
    n = len(cfg["cluster"]["worker"])
    index = cfg["task"]["index"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))

    @tf.function
    def step():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(float(index + 1)))

    result = strategy.experimental_local_results(strategy.run(step))[0].numpy()
    expected = n * (n + 1) / 2
    assert result == expected, f"worker {index}: all_reduce gave {result}, expected {expected}"
    os.write(1, (f"OK worker={index} workers={n} allreduce={result:g} replicas={strategy.num_replicas_in_sync}" + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
