#!/usr/bin/env bash
# Keeps one of the node's components running (started by scripts/node.sh; not meant to be run alone), as
# systemd or the kubelet keeps a real cluster's control plane running.
#
#   supervise.sh NAME CMD [ARGS...]
#
# Runs CMD (the component NAME), and runs it again whenever it exits: after 1 s, doubling up to 10 s while it keeps exiting within
# 30 s of its start. Each exit is logged as a line starting with "[supervise]" (scripts/node.sh up fails at the
# first one: during a start nothing may exit). SIGTERM or SIGINT stops it: passed on to CMD, waited for, no restart.
# Why: kube-controller-manager 1.20 exits (klog.Fatal) when the API server is away at the wrong moment (while it
# starts, or while it fetches a controller's ServiceAccount token), so restarting the API server in a fault test
# would otherwise leave the node without a controller manager.
set -uo pipefail

NAME=$1
shift

stopping=0
child=
on_signal() {
    stopping=1
    [[ -z $child ]] || kill -TERM "$child" 2>/dev/null
}
trap on_signal TERM INT

delay=1
while :; do
    started=$SECONDS
    "$@" &
    child=$!
    # `wait` returns early when a signal arrives: wait again until the child is really gone
    wait "$child"
    rc=$?
    while kill -0 "$child" 2>/dev/null; do
        wait "$child"
        rc=$?
    done
    child=
    ((stopping)) && exit 0
    echo "[supervise] $(date -u +%H:%M:%S) $NAME exited with status $rc; starting it again in ${delay}s" >&2
    sleep "$delay" &
    wait $! 2>/dev/null
    ((stopping)) && exit 0
    if ((SECONDS - started > 30)); then
        delay=1
    else
        delay=$((delay * 2 > 10 ? 10 : delay * 2))
    fi
done
