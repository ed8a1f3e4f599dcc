#!/usr/bin/env bash
# follow-head.sh HOST:PORT COMMAND...: run COMMAND once nothing answers at HOST:PORT (the Ray head's GCS).
# `ray down` on the local provider runs `ray stop` on the head only and merely forgets the workers: a
# worker started with this (`... ray stop`) leaves with the head, and so does the head's Prometheus
# (`... testbed dashboards down`), instead of running on after the cluster is gone.
host=${1%:*}
port=${1##*:}
shift
while (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; do sleep 2; done
exec "$@"
