#!/bin/sh
# Prints what a training script sees from the launcher: one JSON line per rank, written with
# ONE printf so that ranks' lines cannot interleave. Values are digits or simple names.
line="TBCONF {\"host\":\"$(hostname)\""
for v in OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE \
         OMPI_COMM_WORLD_NODE_RANK PMI_RANK PMI_SIZE MPI_LOCALRANKID MPI_LOCALNRANKS \
         NODE_RANK RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE; do
  eval "val=\${$v-}"
  [ -n "$val" ] && line="$line,\"$v\":\"$val\""
done
printf '%s}\n' "$line"
