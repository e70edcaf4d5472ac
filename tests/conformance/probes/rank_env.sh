#!/bin/sh
# Prints what a training script sees from the launcher: one JSON line per rank.
# Values are digits or simple names, so plain printf makes valid JSON.
printf 'TBCONF {"host":"%s"' "$(hostname)"
for v in OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE \
         OMPI_COMM_WORLD_NODE_RANK PMI_RANK PMI_SIZE MPI_LOCALRANKID MPI_LOCALNRANKS \
         NODE_RANK RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE; do
  eval "val=\${$v-}"
  [ -n "$val" ] && printf ',"%s":"%s"' "$v" "$val"
done
printf '}\n'
