#!/usr/bin/env bash
# follow-head.sh HOST:PORT COMMAND...: run COMMAND once nothing answers at HOST:PORT (the Ray head's GCS)
# three times running, 2 s apart (a single lost connection is not the head going away).
# `ray down` on the local provider runs `ray stop` on the head only and merely forgets the workers: a
# worker started with this (`... ray stop`) leaves with the head, and so does the head's Prometheus
# (`... testbed dashboards down`), instead of running on after the cluster is gone.
host=${1%:*}
port=${1##*:}
shift
misses=0
while [ "$misses" -lt 3 ]; do
    if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then misses=0; else misses=$((misses + 1)); fi
    sleep 2
done
exec "$@"
