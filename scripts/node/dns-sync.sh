#!/usr/bin/env bash
# The one-node cluster's DNS records (started by scripts/node.sh; not meant to be run alone).
#
#   dns-sync.sh API_URL CA_FILE HEADER_FILE HOSTS_FILE DNSMASQ_PID_FILE
#
# Keeps HOSTS_FILE (dnsmasq's --addn-hosts) equal to what kube-dns would serve for A records:
#   CLUSTER_IP  NAME.NS.svc.cluster.local                   every Service with a ClusterIP
#   POD_IP      NAME.NS.svc.cluster.local                   every address of a headless Service's Endpoints
#   POD_IP      HOSTNAME.NAME.NS.svc.cluster.local          ... that has a hostname (pods with a `subdomain`)
# (not-ready addresses too when the Service has publishNotReadyAddresses). Pods resolve the short forms
# (NAME.NS.svc, NAME.NS, NAME) through the search domains kubelet writes into their resolv.conf.
# When the file changes it is replaced by a rename and dnsmasq gets SIGHUP (it re-reads addn-hosts).
# Changes are noticed through a watch on Endpoints (the Endpoints controller writes one for every Service with
# a selector, the API server one for `kubernetes`), and everything is listed again at least every 10 s.
# HEADER_FILE holds the `Authorization: Bearer ...` line (curl -H @FILE: the token is not on a command line).
set -uo pipefail

API=$1 CA=$2 HEADER=$3 HOSTS=$4 PIDFILE=$5
CURL=(curl -sS --fail --cacert "$CA" -H "@$HEADER")

# shellcheck disable=SC2016 # a jq program, not shell
RENDER='
  ([$svc.items[] | select(.spec.clusterIP == "None") | {key: "\(.metadata.namespace)/\(.metadata.name)",
    value: (.spec.publishNotReadyAddresses // false)}] | from_entries) as $headless
  | ($svc.items[] | select((.spec.clusterIP // "") != "" and .spec.clusterIP != "None")
     | "\(.spec.clusterIP) \(.metadata.name).\(.metadata.namespace).svc.cluster.local"),
    ($ep.items[] | "\(.metadata.namespace)/\(.metadata.name)" as $key | select($headless | has($key))
     | .metadata as $m | (.subsets // [])[]
     | ((.addresses // []) + (if $headless[$key] then (.notReadyAddresses // []) else [] end))[]
     | "\(.ip) \($m.name).\($m.namespace).svc.cluster.local",
       (select(.hostname) | "\(.ip) \(.hostname).\($m.name).\($m.namespace).svc.cluster.local"))
'

# One pass: list Services and Endpoints, rewrite the hosts file if it changed; prints the Endpoints list's
# resourceVersion (where the next watch starts).
sync_once() {
    local svc ep rendered
    svc=$("${CURL[@]}" "$API/api/v1/services") || return 1
    ep=$("${CURL[@]}" "$API/api/v1/endpoints") || return 1
    rendered=$(jq -rn --argjson svc "$svc" --argjson ep "$ep" "$RENDER" | sort -u) || return 1
    if [[ ! -f $HOSTS ]] || [[ $rendered != "$(cat "$HOSTS")" ]]; then
        printf '%s\n' "$rendered" >"$HOSTS.tmp" && chmod 0644 "$HOSTS.tmp" && mv -f "$HOSTS.tmp" "$HOSTS"
        kill -HUP "$(cat "$PIDFILE")" 2>/dev/null || true
        echo "[dns-sync] $(date -u +%H:%M:%S) $(wc -l <"$HOSTS") records" >&2
    fi
    jq -r '.metadata.resourceVersion' <<<"$ep"
}

trap 'exit 0' TERM INT
while :; do
    sleep 0.3 # debounces a burst of events into one pass
    if ! rv=$(sync_once); then
        sleep 1
        continue
    fi
    # Block until the first Endpoints event after that list (or 10 s): the first byte of the stream is enough.
    "${CURL[@]}" -N --max-time 12 \
        "$API/api/v1/endpoints?watch=1&resourceVersion=$rv&timeoutSeconds=10" 2>/dev/null | head -c 1 >/dev/null
done
