#!/usr/bin/env bash
# A real one-node Kubernetes 1.20 cluster on this machine, and the way back to the machine as it was.
#
#   scripts/node.sh up        start it (or find it up); the last stdout line is the admin kubeconfig's path
#   scripts/node.sh down      stop everything it started and restore every host change (idempotent)
#   scripts/node.sh status    exit 0 iff it is up: every process alive, API server ready, node Ready
#   scripts/node.sh env       prints KUBECONFIG=... (for `eval "$(scripts/node.sh env)"`)
#   scripts/node.sh load IMAGE[=ARCHIVE]...   copy images into the node's containerd (k8s.io): from an OCI archive
#                                   when given (scripts/build-images.sh keeps one per image), else from buildah
#   scripts/node.sh restart COMPONENT   stop one component and start it again as it was (fault tests); one of
#                             etcd kube-apiserver kube-controller-manager kube-scheduler containerd dnsmasq
#                             dns-sync kubelet kube-proxy; returns once it answers again
#
# What runs (as root, in the background, each in a session of its own under scripts/node/supervise.sh, which
# starts it again should it exit; all in the cgroup eagle3-node of every hierarchy; logs in $STATE/logs/NAME.log):
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler (Kubernetes 1.20 from scripts/build-kube.sh),
#   containerd (its own config, socket and state; images in a persistent root under the cache, so imported
#   images survive down/up), kubelet, kube-proxy (iptables mode), dnsmasq (the cluster DNS, no upstream) fed by
#   scripts/node/dns-sync.sh, and a pause image built by scripts/build-pause-image.sh.
# Identities: static tokens (--token-auth-file) for admin (system:masters) and for each component under its
# usual name, so RBAC's bootstrap bindings and the Node authorizer grant what it needs (nothing more).
# Addresses (10.236.0.0/16, nothing else; see docs/real-node.md):
#   10.236.0.1/24    the node: bridge e3node0 without ports; API server :6443, etcd :2379, kubelet :10250, DNS :53
#   10.236.64.0/20   pods: bridge e3cni0 (gateway .1), CNI bridge + host-local, no masquerade
#   10.236.128.0/20  Services (kubernetes = 10.236.128.1), routed to e3node0
# and the containment: a route `unreachable 10.236.0.0/16`, and iptables rules dropping anything from or to
# 10.236.0.0/16 that would leave (or enter) by the default-route interface, and that refuse that interface to the
# node's own processes and to pods altogether (an iptables cgroup match on eagle3-node and kubepods).
#
# Environment:
#   EAGLE3_NODE_STATE   state directory (default /run/eagle3-node): pki, kubeconfigs, etcd, kubelet, logs, and the
#                       record of the host as it was before `up` (host/), which `down` restores
#   EAGLE3_NODE_CACHE   persistent cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/node):
#                       containerd's root (images), the pause image, cold-start times
#   EAGLE3_NODE_KEEP_ON_FAILURE=1   a failed `up` leaves everything running for inspection (default: it runs
#                       `down`, keeping the logs in $EAGLE3_NODE_CACHE/last-failure/)
# Needs: Linux, root, cgroup v1 mounted read-write, Debian packages (installed with apt-get when missing).
set -euo pipefail

SCRIPT_NAME=node
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/machine-cache.sh
source "$ROOT/scripts/machine-cache.sh"

STATE=${EAGLE3_NODE_STATE:-/run/eagle3-node}
STATE=${STATE%/}
CACHE=${EAGLE3_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/node}
LOCK=$CACHE/node.lock # one node per machine (its addresses and links are fixed), whatever its state directory
CTRD_ROOT=$CACHE/containerd
CTRD_SOCK=$STATE/containerd/containerd.sock
KUBECONFIG_PATH=$STATE/admin.kubeconfig

NODE_NAME=eagle3-node
NODE_BRIDGE=e3node0
NODE_IP=10.236.0.1
NODE_PREFIX=24
CNI_BRIDGE=e3cni0
POD_CIDR=10.236.64.0/20
POD_GW=10.236.64.1
SERVICE_CIDR=10.236.128.0/20
API_SERVICE_IP=10.236.128.1
ALL_RANGES=10.236.0.0/16
API_URL=https://$NODE_IP:6443
LOG_OFFSET=0 # where the current run of a component starts in its log (`restart` appends to the log)
CLUSTER_DOMAIN=cluster.local

# Host state that kubelet, kube-proxy, the CNI plugins and this script change: recorded before `up`, restored
# by `down`. Sysctls that do not exist are skipped; directories are removed only if `up` created them.
SYSCTLS=(
    vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
    kernel.keys.root_maxkeys kernel.keys.root_maxbytes
    net.ipv4.ip_forward net.ipv4.conf.all.route_localnet
    net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
    net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
    net.netfilter.nf_conntrack_tcp_timeout_close_wait
)
HOST_DIRS=(/var/log/pods /var/log/containers /var/lib/cni /var/lib/kubelet /run/containerd /run/netns
    /opt/containerd /etc/cni /opt/cni)
# the daemons, in start order (stopped in reverse)
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd dnsmasq dns-sync kubelet
    kube-proxy)
# iptables chains that are the node's: kubelet's and kube-proxy's, and this script's (the CNI config uses no plugin
# that makes chains; CNI-* chains on this machine are other tools', buildah's say) -- those not there before `up`
OUR_CHAINS='KUBE-|E3NODE-'
PKGS=(containerd runc containernetworking-plugins buildah dnsmasq-base iptables iproute2 conntrack openssl curl jq
    util-linux gcc libc6-dev)

now() { echo "${EPOCHREALTIME/,/.}"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

node_lock() { # one up/down/restart at a time: held (fd 9) until the script exits; daemons close it (start)
    mkdir -p "$CACHE"
    exec 9>"$LOCK"
    if ! flock -n 9; then
        log "another scripts/node.sh up/down/restart is running (lock $LOCK); waiting for it"
        flock 9
    fi
}

# --- requirements --------------------------------------------------------------------------------------------
cgroup_hierarchies() { # every cgroup hierarchy mounted under /sys/fs/cgroup (v1 ones, and v2's in hybrid mode)
    local d
    for d in /sys/fs/cgroup/*/; do
        [[ -f $d/cgroup.procs ]] && echo "${d%/}"
    done
    return 0
}

# The node's own cgroup, eagle3-node, in every hierarchy: its daemons (and containerd's shims) are in it, not in
# the cgroups of whoever ran `up`; `down` kills what is in it; and an iptables rule on the v2 path keeps all of
# them off the default-route interface. (Pods are in kubepods*, where runc puts them.)
make_node_cgroup() {
    local h
    CGROUPS=()
    for h in $(cgroup_hierarchies); do
        mkdir -p "$h/eagle3-node"
        if [[ -f $h/cpuset.cpus ]]; then # a v1 cpuset cgroup takes no process before it has cpus and mems
            cat "$h/cpuset.cpus" >"$h/eagle3-node/cpuset.cpus"
            cat "$h/cpuset.mems" >"$h/eagle3-node/cpuset.mems"
        fi
        CGROUPS+=("$h/eagle3-node")
    done
    # runc puts the pods under kubepods in the v2 hierarchy too, but only with the first pod: made here, so
    # that the iptables rule on its path (contain) exists from the start
    local cg2
    cg2=$(cgroup2_root)
    [[ -z $cg2 ]] || mkdir -p "$cg2/kubepods"
}

check_host() {
    [[ $(uname -s) == Linux ]] || die "needs Linux"
    [[ $(id -u) -eq 0 ]] || die "needs root (it runs kubelet and containerd and changes network and cgroup state)"
    [[ -d /sys/fs/cgroup/memory && -w /sys/fs/cgroup/memory ]] ||
        die "needs cgroup v1 mounted read-write (/sys/fs/cgroup/memory); this machine has $(stat -fc %T /sys/fs/cgroup)"
    [[ -n $(cgroup_hierarchies) ]] || die "no cgroup hierarchy with cgroup.procs under /sys/fs/cgroup"
}

install_packages() {
    local missing=() p
    for p in "${PKGS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    # The nf_tables backend of iptables leaves empty tables behind; nft deletes the ones `up` created.
    if iptables -V 2>/dev/null | grep -q nf_tables && ! command -v nft >/dev/null; then missing+=(nftables); fi
    command -v etcd >/dev/null || missing+=(etcd-server)
    ((${#missing[@]} == 0)) && return 0
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get -qq update
    DEBIAN_FRONTEND=noninteractive apt-get -qq -y install --no-install-recommends "${missing[@]}" >/dev/null
}

# --- processes -------------------------------------------------------------------------------------------------
# a process that has not exited (a zombie has: the daemons' parent is PID 1, which may reap them late)
alive() { [[ -r /proc/$1/status ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

pid_of() { # the recorded pid of a component if that process is still the component
    local f=$STATE/pids/$1 pid
    [[ -f $f ]] || return 1
    pid=$(<"$f")
    [[ -n $pid ]] && alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$(<"$STATE/pids/$1.match")" || return 1
    echo "$pid"
}

# start NAME MATCH CMD...: CMD in the background under scripts/node/supervise.sh (run again if it exits), in a
# session of its own and in the node's cgroup, its output in logs/NAME.log; MATCH is a string of its command line
# (pid_of checks it, against pid reuse). The recorded pid is the supervisor's; its process group holds CMD.
start() {
    local name=$1 match=$2
    shift 2
    echo "$match" >"$STATE/pids/$name.match"
    printf '%s\0' "$@" >"$STATE/pids/$name.argv" # for `restart`
    (
        exec 9>&- # the lock of up/down: a daemon holding it would block every later up and down
        for cg in "${CGROUPS[@]}"; do echo "$BASHPID" >"$cg/cgroup.procs"; done
        exec setsid env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="$STATE/home" \
            LANG=C.UTF-8 bash "$ROOT/scripts/node/supervise.sh" "$name" "$@"
    ) </dev/null >>"$STATE/logs/$name.log" 2>&1 &
    local pid=$! n=0
    echo "$pid" >"$STATE/pids/$name"
    until pid_of "$name" >/dev/null; do # until it has exec'd CMD
        alive "$pid" || fail_component "$name" "exited at once"
        ((n++ < 200)) || fail_component "$name" "did not start"
        sleep 0.05
    done
}

fail_component() { # NAME MESSAGE: the end of its log, then die (the EXIT trap cleans up)
    log "$1 $2; the end of $STATE/logs/$1.log:"
    tail -n 40 "$STATE/logs/$1.log" >&2 || true
    FAIL_REASON="$1 $2"
    die "$1: $2 (all logs: $STATE/logs/)"
}

# wait_for NAME TIMEOUT_S CMD...: until CMD succeeds; dies if NAME exits or the time is up
wait_for() {
    local name=$1 timeout=$2 deadline
    shift 2
    deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        pid_of "$name" >/dev/null || fail_component "$name" "exited"
        tail -c "+$((LOG_OFFSET + 1))" "$STATE/logs/$name.log" 2>/dev/null | grep '^\[supervise\]' >/dev/null &&
            fail_component "$name" "exited"
        ((SECONDS < deadline)) || fail_component "$name" "not ready after ${timeout}s"
        sleep 0.2
    done
}

api() { # PATH [curl args]: a call as admin
    local path=$1
    shift
    curl -sS --fail --max-time 10 --cacert "$STATE/pki/ca.crt" -H "@$STATE/etc/admin.header" "$@" "$API_URL$path"
}

ctr_() { timeout 60 ctr --address "$CTRD_SOCK" --namespace k8s.io "$@"; }

# has_image REF: whether containerd lists REF. The list is read whole first: `ctr_ images list | grep -q`
# under pipefail is false whenever grep's early exit cuts ctr's later writes (SIGPIPE), which grew likely as
# the persistent root collected images of older keys ("did not import" for an image that was there).
has_image() {
    local images
    images=$(ctr_ images list --quiet) || return 1
    grep -qxF -- "$1" <<<"$images"
}

node_ready() {
    api "/api/v1/nodes/$NODE_NAME" | jq -e '.status.conditions[] | select(.type == "Ready") | .status == "True"'
}

default_sa_ready() { # pods are refused until their ServiceAccount has its token secret (1.20)
    api /api/v1/namespaces/default/serviceaccounts/default | jq -e '.secrets | length > 0'
}

is_up() {
    [[ -f $STATE/ready ]] || return 1
    local c
    for c in "${COMPONENTS[@]}"; do pid_of "$c" >/dev/null || return 1; done
    api /readyz >/dev/null 2>&1 || return 1
    node_ready >/dev/null 2>&1
}

# --- files: certificates, tokens, kubeconfigs, configs -------------------------------------------------------
make_cert() { # NAME SUBJECT EXT [CA]: a key and a certificate signed by CA (default ca), with extensions EXT
    local name=$1 subj=$2 ext=$3 ca=${4:-ca} d=$STATE/pki
    openssl genrsa -out "$d/$name.key" 2048 2>/dev/null
    openssl req -new -key "$d/$name.key" -subj "$subj" -out "$d/$name.csr" 2>/dev/null
    printf '%s\n' "$ext" >"$d/$name.ext"
    openssl x509 -req -in "$d/$name.csr" -CA "$d/$ca.crt" -CAkey "$d/$ca.key" -CAcreateserial -days 3650 \
        -sha256 -extfile "$d/$name.ext" -out "$d/$name.crt" 2>/dev/null
    rm -f "$d/$name.csr" "$d/$name.ext"
}

kubeconfig() { # FILE USER TOKEN
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $NODE_NAME
  cluster:
    server: $API_URL
    certificate-authority-data: $(base64 -w0 "$STATE/pki/ca.crt")
users:
- name: $2
  user:
    token: $3
contexts:
- name: $2@$NODE_NAME
  context: {cluster: $NODE_NAME, user: $2}
current-context: $2@$NODE_NAME
EOF
    chmod 0600 "$1"
}

write_files() {
    local d=$STATE/pki
    mkdir -p "$d" "$STATE/etc" "$STATE/logs" "$STATE/pids" "$STATE/home" "$STATE/dns" "$STATE/cni/net.d" \
        "$STATE/kubelet" "$STATE/containerd"
    chmod 0700 "$d" "$STATE/etc"
    openssl req -x509 -new -nodes -newkey rsa:2048 -keyout "$d/ca.key" -out "$d/ca.crt" -days 3650 -sha256 \
        -subj "/CN=eagle3-node-ca" 2>/dev/null
    make_cert apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN,DNS:$NODE_NAME,DNS:localhost,IP:$API_SERVICE_IP,IP:$NODE_IP,IP:127.0.0.1"
    make_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    make_cert kubelet "/CN=$NODE_NAME" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:$NODE_NAME,IP:$NODE_IP"
    # the aggregation layer's own CA (as kubeadm's front-proxy-ca): the API server's request-header
    # authentication, which the controller manager's and the scheduler's delegated authentication read
    openssl req -x509 -new -nodes -newkey rsa:2048 -keyout "$d/front-proxy-ca.key" -out "$d/front-proxy-ca.crt" \
        -days 3650 -sha256 -subj "/CN=eagle3-node-front-proxy-ca" 2>/dev/null
    make_cert front-proxy-client "/CN=front-proxy-client" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth" front-proxy-ca
    openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
    openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
    chmod 0644 "$d/ca.crt"

    # Static tokens: admin (system:masters) for people and tests; the node's components with their usual
    # identities, which RBAC's bootstrap bindings (and the Node authorizer, for the kubelet) already grant.
    local admin kubelet proxy cm sched dns
    admin=$(openssl rand -hex 16) kubelet=$(openssl rand -hex 16) proxy=$(openssl rand -hex 16)
    cm=$(openssl rand -hex 16) sched=$(openssl rand -hex 16) dns=$(openssl rand -hex 16)
    cat >"$STATE/etc/tokens.csv" <<EOF
$admin,admin,admin,"system:masters"
$kubelet,system:node:$NODE_NAME,kubelet,"system:nodes"
$proxy,system:kube-proxy,kube-proxy
$cm,system:kube-controller-manager,kube-controller-manager
$sched,system:kube-scheduler,kube-scheduler
$dns,eagle3-node:dns,eagle3-node-dns
EOF
    echo "Authorization: Bearer $admin" >"$STATE/etc/admin.header"
    echo "Authorization: Bearer $dns" >"$STATE/etc/dns.header"
    kubeconfig "$KUBECONFIG_PATH.tmp" admin "$admin"
    kubeconfig "$STATE/etc/kubelet.kubeconfig" "system:node:$NODE_NAME" "$kubelet"
    kubeconfig "$STATE/etc/kube-proxy.kubeconfig" system:kube-proxy "$proxy"
    kubeconfig "$STATE/etc/controller-manager.kubeconfig" system:kube-controller-manager "$cm"
    kubeconfig "$STATE/etc/scheduler.kubeconfig" system:kube-scheduler "$sched"

    # containerd: its own socket and state; the images' root in the cache. restrict_oom_score_adj: this VM's
    # root lacks CAP_SYS_RESOURCE, so runc cannot give the sandbox a negative oom_score_adj.
    cat >"$STATE/etc/containerd.toml" <<EOF
version = 2
root = "$CTRD_ROOT"
state = "$STATE/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$CTRD_SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_REF"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
        Root = "$STATE/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
    max_conf_num = 1
EOF

    cat >"$STATE/cni/net.d/10-eagle3-node.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "eagle3-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GW"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$STATE/cni/ipam"
      }
    },
    {"type": "loopback"}
  ]
}
EOF

    # Pods' DNS is the node's dnsmasq; never an empty resolv.conf (containerd would copy the host's into pods).
    printf 'nameserver %s\nsearch %s\noptions ndots:5\n' "$NODE_IP" "$CLUSTER_DOMAIN" >"$STATE/etc/resolv.conf"

    cat >"$STATE/etc/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: $NODE_IP
healthzPort: 10248
cgroupDriver: cgroupfs
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
resolvConf: $STATE/etc/resolv.conf
clusterDNS: [$NODE_IP]
clusterDomain: $CLUSTER_DOMAIN
tlsCertFile: $d/kubelet.crt
tlsPrivateKeyFile: $d/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $d/ca.crt}
authorization: {mode: Webhook}
serializeImagePulls: false
# images are imported, never pulled: keep them (no image GC, no eviction for disk below 1 % free)
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
volumeStatsAggPeriod: 1m
EOF

    cat >"$STATE/etc/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
bindAddress: $NODE_IP
healthzBindAddress: $NODE_IP:10256
metricsBindAddress: $NODE_IP:10249
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
nodePortAddresses: [$NODE_IP/32]
oomScoreAdj: 0
clientConnection: {kubeconfig: $STATE/etc/kube-proxy.kubeconfig}
# 0: leave the host's conntrack limits and timeouts as they are
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {masqueradeAll: false, syncPeriod: 30s, minSyncPeriod: 1s}
EOF

    cat >"$STATE/dns/dnsmasq.conf" <<EOF
port=53
listen-address=$NODE_IP
bind-interfaces
no-resolv
no-hosts
no-poll
addn-hosts=$STATE/dns/hosts
local=/$CLUSTER_DOMAIN/
domain-needed
bogus-priv
pid-file=$STATE/dns/dnsmasq.pid
log-facility=-
cache-size=1000
EOF
    printf '%s kubernetes.default.svc.%s\n' "$API_SERVICE_IP" "$CLUSTER_DOMAIN" >"$STATE/dns/hosts"
    chmod 0755 "$STATE/dns" && chmod 0644 "$STATE/dns/hosts"
}

# --- the host: record, network, containment ------------------------------------------------------------------
uplink() { ip -o route show default 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }'; }

record_host() {
    local h=$STATE/host k d
    mkdir -p "$h"
    : >"$h/sysctls"
    for k in "${SYSCTLS[@]}"; do
        [[ -f /proc/sys/${k//.//} ]] && echo "$k=$(sysctl -n "$k")" >>"$h/sysctls"
    done
    : >"$h/absent-dirs"
    for d in "${HOST_DIRS[@]}"; do [[ -e $d ]] || echo "$d" >>"$h/absent-dirs"; done
    iptables-save >"$h/iptables.v4" 2>/dev/null || true
    ip6tables-save >"$h/iptables.v6" 2>/dev/null || true
    if command -v nft >/dev/null; then nft list tables >"$h/nft-tables" 2>/dev/null || true; fi
    ls -1 /run/netns >"$h/netns" 2>/dev/null || true
    uplink >"$h/uplink"
    touch "$h/complete"
}

# Chains and rules (in new chains named E3NODE-*): anything from or to 10.236.0.0/16 that would leave by the
# default-route interface is dropped, in filter OUTPUT and FORWARD and again in mangle POSTROUTING (after
# kube-proxy's DNAT, where kube-proxy's own rules cannot come first), also by its conntrack original
# addresses; and anything for those ranges arriving on it.
contain() {
    local up ipt=(iptables -w 5)
    up=$(<"$STATE/host/uplink")
    [[ -n $up ]] || {
        log "no default route: nothing to contain towards"
        return 0
    }
    "${ipt[@]}" -t filter -N E3NODE-OUT
    "${ipt[@]}" -t filter -A E3NODE-OUT -o "$up" -s "$ALL_RANGES" -j DROP
    "${ipt[@]}" -t filter -A E3NODE-OUT -o "$up" -d "$ALL_RANGES" -j DROP
    # the node's own processes and the pods (host-network ones: their traffic is not forwarded) never use that
    # interface at all; REJECT, so that an attempt fails at once and shows in the rule's counters
    if [[ -n $(cgroup2_root) ]]; then
        "${ipt[@]}" -t filter -A E3NODE-OUT -o "$up" -m cgroup --path eagle3-node -j REJECT
        "${ipt[@]}" -t filter -A E3NODE-OUT -o "$up" -m cgroup --path kubepods -j REJECT
    fi
    "${ipt[@]}" -t filter -I OUTPUT 1 -j E3NODE-OUT
    "${ipt[@]}" -t filter -N E3NODE-FWD
    "${ipt[@]}" -t filter -A E3NODE-FWD -o "$up" -s "$ALL_RANGES" -j DROP
    "${ipt[@]}" -t filter -A E3NODE-FWD -o "$up" -d "$ALL_RANGES" -j DROP
    "${ipt[@]}" -t filter -A E3NODE-FWD -i "$up" -s "$ALL_RANGES" -j DROP
    "${ipt[@]}" -t filter -A E3NODE-FWD -i "$up" -d "$ALL_RANGES" -j DROP
    "${ipt[@]}" -t filter -I FORWARD 1 -j E3NODE-FWD
    "${ipt[@]}" -t mangle -N E3NODE-CONTAIN
    "${ipt[@]}" -t mangle -A E3NODE-CONTAIN -s "$ALL_RANGES" -j DROP
    "${ipt[@]}" -t mangle -A E3NODE-CONTAIN -d "$ALL_RANGES" -j DROP
    "${ipt[@]}" -t mangle -A E3NODE-CONTAIN -m conntrack --ctorigsrc "$ALL_RANGES" -j DROP
    "${ipt[@]}" -t mangle -A E3NODE-CONTAIN -m conntrack --ctorigdst "$ALL_RANGES" -j DROP
    "${ipt[@]}" -t mangle -I POSTROUTING 1 -o "$up" -j E3NODE-CONTAIN
    "${ipt[@]}" -t mangle -N E3NODE-INBOUND
    "${ipt[@]}" -t mangle -A E3NODE-INBOUND -s "$ALL_RANGES" -j DROP
    "${ipt[@]}" -t mangle -A E3NODE-INBOUND -d "$ALL_RANGES" -j DROP
    "${ipt[@]}" -t mangle -I PREROUTING 1 -i "$up" -j E3NODE-INBOUND
}

cgroup2_root() { findmnt -rn -t cgroup2 -o TARGET 2>/dev/null | grep '^/sys/fs/cgroup/' | head -n1; }

network_up() {
    ip link add "$NODE_BRIDGE" type bridge
    ip addr add "$NODE_IP/$NODE_PREFIX" dev "$NODE_BRIDGE"
    ip link set "$NODE_BRIDGE" up
    ip link add "$CNI_BRIDGE" type bridge
    ip addr add "$POD_GW/${POD_CIDR#*/}" dev "$CNI_BRIDGE"
    ip link set "$CNI_BRIDGE" up
    ip route add "$SERVICE_CIDR" dev "$NODE_BRIDGE" src "$NODE_IP"
    ip route add unreachable "$ALL_RANGES"
    contain
    sysctl -qw net.ipv4.ip_forward=1 # pod -> Service -> pod goes through the host's routing
}

# --- up ----------------------------------------------------------------------------------------------------
up() {
    check_host
    install_packages
    local bin
    bin=$("$ROOT/scripts/build-kube.sh" | tail -n1)
    local b
    for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
        [[ -x $bin/$b ]] || die "scripts/build-kube.sh gave no $bin/$b"
    done
    local pause
    pause=$("$ROOT/scripts/build-pause-image.sh") || die "scripts/build-pause-image.sh failed"
    PAUSE_REF=$(head -n1 <<<"$pause")
    PAUSE_ARCHIVE=$(tail -n1 <<<"$pause")

    node_lock
    if is_up; then
        log "already up"
        echo "$KUBECONFIG_PATH"
        return 0
    fi
    if [[ -e $STATE ]] || leftovers; then
        log "found a stale or half-started node in $STATE: cleaning it up first"
        down_locked || die "could not clean up the stale node (see above)"
    fi

    local t0
    t0=$(now)
    mkdir -p "$STATE"
    chmod 0755 "$STATE"
    record_host
    FAIL_REASON=
    set -E # the ERR trap in functions too: what failed, for up_failed's last word
    trap 'FAIL_REASON=${FAIL_REASON:-"\`$BASH_COMMAND\` failed (scripts/node.sh line $LINENO)"}' ERR
    trap 'up_failed' EXIT
    make_node_cgroup
    write_files
    network_up

    start etcd "--data-dir $STATE/etcd" etcd --name "$NODE_NAME" --data-dir "$STATE/etcd" --logger zap \
        --listen-client-urls "http://$NODE_IP:2379" --advertise-client-urls "http://$NODE_IP:2379" \
        --listen-peer-urls "http://$NODE_IP:2380" --initial-advertise-peer-urls "http://$NODE_IP:2380" \
        --initial-cluster "$NODE_NAME=http://$NODE_IP:2380" --listen-metrics-urls ""
    start kube-apiserver "$STATE/pki/apiserver.crt" "$bin/kube-apiserver" \
        --advertise-address="$NODE_IP" --bind-address="$NODE_IP" --secure-port=6443 --insecure-port=0 \
        --etcd-servers="http://$NODE_IP:2379" --service-cluster-ip-range="$SERVICE_CIDR" \
        --tls-cert-file="$STATE/pki/apiserver.crt" --tls-private-key-file="$STATE/pki/apiserver.key" \
        --client-ca-file="$STATE/pki/ca.crt" --token-auth-file="$STATE/etc/tokens.csv" \
        --authorization-mode=Node,RBAC --allow-privileged=true \
        --service-account-key-file="$STATE/pki/sa.pub" --service-account-signing-key-file="$STATE/pki/sa.key" \
        --service-account-issuer="https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
        --api-audiences="https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
        --kubelet-client-certificate="$STATE/pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key="$STATE/pki/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority="$STATE/pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
        --requestheader-client-ca-file="$STATE/pki/front-proxy-ca.crt" \
        --requestheader-allowed-names=front-proxy-client --requestheader-username-headers=X-Remote-User \
        --requestheader-group-headers=X-Remote-Group --requestheader-extra-headers-prefix=X-Remote-Extra- \
        --proxy-client-cert-file="$STATE/pki/front-proxy-client.crt" \
        --proxy-client-key-file="$STATE/pki/front-proxy-client.key" --profiling=false
    wait_for etcd 30 curl -sf --max-time 2 "http://$NODE_IP:2379/health"
    wait_for kube-apiserver 90 api /readyz
    log "API server ready after $(elapsed "$t0") s"

    # the cluster DNS may read Services and Endpoints, nothing else
    api /apis/rbac.authorization.k8s.io/v1/clusterroles -X POST -H 'Content-Type: application/json' -o /dev/null \
        -d '{"metadata":{"name":"eagle3-node:dns"},"rules":[{"apiGroups":[""],"resources":["services","endpoints"],"verbs":["get","list","watch"]}]}'
    api /apis/rbac.authorization.k8s.io/v1/clusterrolebindings -X POST -H 'Content-Type: application/json' -o /dev/null \
        -d '{"metadata":{"name":"eagle3-node:dns"},"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"eagle3-node:dns"},"subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"eagle3-node:dns"}]}'

    start kube-controller-manager "$STATE/etc/controller-manager.kubeconfig" "$bin/kube-controller-manager" \
        --kubeconfig="$STATE/etc/controller-manager.kubeconfig" \
        --authentication-kubeconfig="$STATE/etc/controller-manager.kubeconfig" \
        --authorization-kubeconfig="$STATE/etc/controller-manager.kubeconfig" \
        --bind-address="$NODE_IP" --port=0 --leader-elect=false --use-service-account-credentials=true \
        --service-account-private-key-file="$STATE/pki/sa.key" --root-ca-file="$STATE/pki/ca.crt" \
        --cluster-signing-cert-file="$STATE/pki/ca.crt" --cluster-signing-key-file="$STATE/pki/ca.key" \
        --service-cluster-ip-range="$SERVICE_CIDR" --allocate-node-cidrs=false --profiling=false
    start kube-scheduler "$STATE/etc/scheduler.kubeconfig" "$bin/kube-scheduler" \
        --kubeconfig="$STATE/etc/scheduler.kubeconfig" \
        --authentication-kubeconfig="$STATE/etc/scheduler.kubeconfig" \
        --authorization-kubeconfig="$STATE/etc/scheduler.kubeconfig" \
        --bind-address="$NODE_IP" --port=0 --leader-elect=false --profiling=false

    start containerd "$STATE/etc/containerd.toml" containerd --config "$STATE/etc/containerd.toml"
    wait_for containerd 30 ctr_ version
    # containers left in the persistent root by a node that was killed: nothing may come back from them
    local c
    for c in $(ctr_ containers list --quiet); do ctr_ containers delete "$c" >/dev/null 2>&1 || true; done
    # the import's own words go to containerd's log (they are what a failure needs); twice, with the load's
    # bound rather than ctr_'s 60 s
    local try
    for try in 1 2; do
        has_image "$PAUSE_REF" && break
        timeout 600 ctr --address "$CTRD_SOCK" --namespace k8s.io images import --base-name "${PAUSE_REF%:*}" \
            "$PAUSE_ARCHIVE" >>"$STATE/logs/containerd.log" 2>&1 || log "pause image import, try $try, failed"
    done
    has_image "$PAUSE_REF" || fail_component containerd "did not import $PAUSE_REF"

    start dnsmasq "--conf-file=$STATE/dns/dnsmasq.conf" dnsmasq --keep-in-foreground \
        --conf-file="$STATE/dns/dnsmasq.conf"
    wait_for dnsmasq 10 test -s "$STATE/dns/dnsmasq.pid"
    start dns-sync "$STATE/dns/hosts" bash "$ROOT/scripts/node/dns-sync.sh" "$API_URL" "$STATE/pki/ca.crt" \
        "$STATE/etc/dns.header" "$STATE/dns/hosts" "$STATE/dns/dnsmasq.pid"

    # AWS_EC2_METADATA_DISABLED: kubelet 1.20's ECR credential provider otherwise asks 169.254.169.254
    start kubelet "$STATE/etc/kubelet.yaml" env AWS_EC2_METADATA_DISABLED=true "$bin/kubelet" --config="$STATE/etc/kubelet.yaml" \
        --kubeconfig="$STATE/etc/kubelet.kubeconfig" --root-dir="$STATE/kubelet" \
        --container-runtime=remote --container-runtime-endpoint="unix://$CTRD_SOCK" \
        --pod-infra-container-image="$PAUSE_REF" --node-ip="$NODE_IP" --hostname-override="$NODE_NAME" \
        --oom-score-adj=0 --v=1
    start kube-proxy "$STATE/etc/kube-proxy.yaml" "$bin/kube-proxy" --config="$STATE/etc/kube-proxy.yaml"

    wait_for kubelet 120 node_ready
    wait_for kube-controller-manager 60 default_sa_ready
    local c2
    for c2 in "${COMPONENTS[@]}"; do pid_of "$c2" >/dev/null || fail_component "$c2" "exited"; done

    mv -f "$KUBECONFIG_PATH.tmp" "$KUBECONFIG_PATH"
    local took
    took=$(elapsed "$t0")
    echo "$took" >"$STATE/cold-start-s"
    mkdir -p "$CACHE"
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) cold start ${took}s (node Ready, default ServiceAccount with a token)" \
        >>"$CACHE/cold-starts.log"
    touch "$STATE/ready"
    trap - EXIT ERR
    log "node $NODE_NAME Ready; cold start ${took} s (recorded in $CACHE/cold-starts.log); logs in $STATE/logs/"
    echo "$KUBECONFIG_PATH"
}

up_failed() {
    local rc=$?
    ((rc == 0)) && return 0
    trap - ERR
    set +E
    if [[ ${EAGLE3_NODE_KEEP_ON_FAILURE:-0} == 1 ]]; then
        log "up failed: ${FAIL_REASON:-exit status $rc}; EAGLE3_NODE_KEEP_ON_FAILURE=1: left as it is (logs in" \
            "$STATE/logs/); \`scripts/node.sh down\` cleans it up"
        return
    fi
    rm -rf "$CACHE/last-failure"
    mkdir -p "$CACHE/last-failure"
    cp -r "$STATE/logs/." "$CACHE/last-failure/" 2>/dev/null || true
    log "up failed: cleaning up"
    down_locked || true
    log "up failed: ${FAIL_REASON:-exit status $rc}; the logs are kept in $CACHE/last-failure/"
}

# --- down ----------------------------------------------------------------------------------------------------
# Something of a node is left even without a state directory (the directory was removed by hand)?
leftovers() {
    ip link show "$NODE_BRIDGE" >/dev/null 2>&1 && return 0
    ip link show "$CNI_BRIDGE" >/dev/null 2>&1 && return 0
    compgen -G "/sys/fs/cgroup/*/eagle3-node" >/dev/null && return 0
    compgen -G "/sys/fs/cgroup/*/kubepods*" >/dev/null && return 0
    [[ -n $(our_pids) ]]
}

# Processes of the node found by their command line (those that escaped the cgroup, or with no cgroup):
# anything mentioning the state directory or containerd's socket (shims: `-address $CTRD_SOCK`).
our_pids() {
    local p
    for p in /proc/[0-9]*; do
        [[ ${p#/proc/} == "$$" || ${p#/proc/} == "$BASHPID" ]] && continue
        local cmdline
        cmdline=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
        case $(cat "$p/comm" 2>/dev/null) in
        etcd | kube-* | kubelet | containerd* | runc | dnsmasq | curl) ;;
        bash) [[ $cmdline == *scripts/node/supervise.sh* || $cmdline == *scripts/node/dns-sync.sh* ]] || continue ;;
        *) continue ;;
        esac
        [[ $cmdline == *"$STATE/"* || $cmdline == *"$CTRD_SOCK"* ]] && echo "${p#/proc/}"
    done
    return 0
}

cgroup_pids() { # every process in the node's cgroups (its daemons, shims) and in the pods' (kubepods*)
    local f
    for f in /sys/fs/cgroup/*/eagle3-node /sys/fs/cgroup/*/kubepods*; do
        [[ -d $f ]] && find "$f" -name cgroup.procs -exec cat {} + 2>/dev/null
    done | sort -u
    return 0
}

kill_pids() { # SIGNAL PID...
    local sig=$1
    shift
    (($#)) && kill "-$sig" "$@" 2>/dev/null
    return 0
}

stop_component() { # NAME [SECONDS]: SIGTERM to its process group, SIGKILL after SECONDS (default 10)
    local pid n=0 limit=$((${2:-10} * 20))
    pid=$(pid_of "$1") || return 0
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    while alive "$pid" && ((n++ < limit)); do sleep 0.05; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
}

kill_pods() { # every container process (in the kubepods cgroups), until none is left
    local pids
    for _ in $(seq 1 50); do
        mapfile -t pids < <(for f in /sys/fs/cgroup/*/kubepods*; do
            [[ -d $f ]] && find "$f" -name cgroup.procs -exec cat {} + 2>/dev/null
        done | sort -u)
        ((${#pids[@]} == 0)) && return 0
        kill_pids KILL "${pids[@]}"
        sleep 0.1
    done
    FAILURES+=("processes left in the kubepods cgroups: ${pids[*]}")
}

# a network namespace of containerd's CNI (cni-*) that was not there before `up`
our_netns() {
    [[ ${1##*/} == cni-* ]] || return 1
    [[ -f $STATE/host/netns ]] && grep -qxF "${1##*/}" "$STATE/host/netns" && return 1
    return 0
}

# a mount of the node: under the state dir or containerd's root, a CNI network namespace of its own, or under
# /run/containerd (the shims' sockets) when that did not exist before `up`
our_mount() {
    case $1 in
    "$STATE"/* | "$CTRD_ROOT"/*) return 0 ;;
    /run/netns/* | /var/run/netns/*) our_netns "$1" ;;
    /run/containerd/*) [[ ! -f $STATE/host/absent-dirs ]] || grep -qxF /run/containerd "$STATE/host/absent-dirs" ;;
    *) return 1 ;;
    esac
}

unmount_ours() { # every mount of the node (our_mount), deepest first
    local mounts
    for _ in 1 2 3 4 5; do
        mapfile -t mounts < <(awk '{ print $5 }' /proc/self/mountinfo | while read -r m; do
            m=$(printf '%b' "${m//\\/\\0}") # mountinfo escapes spaces as \040
            our_mount "$m" && echo "$m"
        done | awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-)
        ((${#mounts[@]} == 0)) && return 0
        local m
        for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
    done
    FAILURES+=("mounts left: ${mounts[*]}")
}

# iptables/ip6tables: the node's chains (OUR_CHAINS, but those that existed before `up`) and every rule jumping to
# them, table by table, in one `iptables-restore --noflush` each (atomic; every other rule and chain stays as it is,
# whoever changes them meanwhile); then the tables `up` brought into existence, if now empty (nf_tables backend).
clean_iptables() {
    local fam=$1 record=$STATE/host/iptables.v4 table dump ops
    [[ $fam == ip6tables ]] && record=$STATE/host/iptables.v6
    for table in $("$fam-save" 2>/dev/null | sed -n 's/^\*//p'); do
        dump=$("$fam-save" -t "$table" 2>/dev/null) || continue
        ops=$(awk -v re="^(${OUR_CHAINS})" -v table="$table" -v rec="$record" '
            BEGIN { # the record: the chains this table had before `up`
                while ((getline line < rec) > 0) {
                    if (line ~ /^\*/) { cur = substr(line, 2) }
                    else if (cur == table && line ~ /^:/) { split(line, f, " "); had[substr(f[1], 2)] = 1 }
                }
            }
            /^:/ { c = substr($1, 2); if (c ~ re && !(c in had)) { ours[c] = 1; order[++n] = c }; next }
            /^-A / {
                target = ""
                for (i = 3; i < NF; i++) if ($i == "-j" || $i == "-g") target = $(i + 1)
                if (!($2 in ours) && (target in ours)) { sub(/^-A /, "-D "); print }
            }
            END { for (i = 1; i <= n; i++) print "-F " order[i]; for (i = 1; i <= n; i++) print "-X " order[i] }
        ' <<<"$dump")
        [[ -n $ops ]] || continue
        printf '*%s\n%s\nCOMMIT\n' "$table" "$ops" | "$fam-restore" -w 5 --noflush ||
            FAILURES+=("$fam-restore --noflush of table $table failed")
    done
}

delete_new_tables() {
    command -v nft >/dev/null || return 0
    iptables -V 2>/dev/null | grep -q nf_tables || return 0
    local before=$STATE/host/nft-tables family table
    [[ -f $before ]] || return 0
    while read -r _ family table; do
        grep -qxF "table $family $table" "$before" && continue
        case $family in ip | ip6) ;; *) continue ;; esac
        # only a table with nothing left in it: no rules, no sets, only iptables' built-in chains
        if nft list table "$family" "$table" 2>/dev/null | awk '
            /^table / || /^[ \t]*}/ || /^[ \t]*$/ || /^[ \t]*type [a-z]+ hook / { next }
            /^[ \t]*chain / { if ($2 !~ /^(INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING)$/) busy = 1; next }
            { busy = 1 }
            END { exit busy }'; then
            nft delete table "$family" "$table" 2>/dev/null || FAILURES+=("nft delete table $family $table failed")
        fi
    done < <(nft list tables 2>/dev/null)
}

remove_cgroups() {
    local top left
    for _ in $(seq 1 30); do
        left=0
        for top in /sys/fs/cgroup/*/kubepods* /sys/fs/cgroup/*/eagle3-node; do
            [[ -d $top ]] || continue
            find "$top" -depth -type d -exec rmdir {} \; 2>/dev/null || true
            [[ -d $top ]] && left=1
        done
        ((left == 0)) && return 0
        local pids
        mapfile -t pids < <(cgroup_pids)
        kill_pids KILL "${pids[@]}"
        sleep 0.2
    done
    FAILURES+=("cgroups left: $(echo /sys/fs/cgroup/*/kubepods* /sys/fs/cgroup/*/eagle3-node)")
}

down() {
    check_host
    node_lock
    if [[ ! -e $STATE ]] && ! leftovers; then
        log "not up: nothing to do"
        return 0
    fi
    down_locked || exit 1
}

# Best effort, step after step (called where errexit does not apply): what fails is collected in FAILURES.
down_locked() {
    local t0
    t0=$(now)
    FAILURES=()
    [[ -f $STATE/host/complete ]] ||
        log "warning: no record of the host before up in $STATE/host: sysctls and directories stay as they are"

    # 1. the node's agents first (nothing restarts pods), then the pods, then the runtime, then the control plane
    local c
    for c in kube-proxy kubelet dns-sync dnsmasq; do stop_component "$c" 5; done
    kill_pods
    if pid_of containerd >/dev/null && [[ -S $CTRD_SOCK ]]; then
        local t
        for t in $(ctr_ tasks list --quiet 2>/dev/null); do
            ctr_ tasks kill --signal SIGKILL "$t" >/dev/null 2>&1 || true
            ctr_ tasks delete --force "$t" >/dev/null 2>&1 || true
        done
        for t in $(ctr_ containers list --quiet 2>/dev/null); do
            ctr_ containers delete "$t" >/dev/null 2>&1 || true
        done
    fi
    for c in containerd kube-scheduler kube-controller-manager kube-apiserver etcd; do stop_component "$c" 10; done
    # 2. whatever is left: shims, strays (by cgroup and by command line)
    local pids
    for _ in $(seq 1 30); do
        mapfile -t pids < <({ cgroup_pids; our_pids; } | sort -u)
        ((${#pids[@]} == 0)) && break
        kill_pids KILL "${pids[@]}"
        sleep 0.1
    done
    ((${#pids[@]} == 0)) || FAILURES+=("processes left: ${pids[*]}")

    # 3. mounts and network namespaces
    unmount_ours
    local ns
    for ns in /run/netns/cni-*; do
        [[ -e $ns ]] && our_netns "$ns" && { rm -f "$ns" || FAILURES+=("cannot remove $ns"); }
    done

    # 4. links and routes (veths die with their namespaces; any left on the CNI bridge go too)
    local l
    for l in $(ip -o link show master "$CNI_BRIDGE" 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
        ip link delete "$l" 2>/dev/null || true
    done
    for l in "$CNI_BRIDGE" "$NODE_BRIDGE"; do
        ip link show "$l" >/dev/null 2>&1 && { ip link delete "$l" || FAILURES+=("cannot delete link $l"); }
    done
    while ip route del unreachable "$ALL_RANGES" 2>/dev/null; do :; done

    # 5. iptables, conntrack entries of the ranges
    clean_iptables iptables
    clean_iptables ip6tables
    delete_new_tables
    conntrack -D --orig-src "${ALL_RANGES%/*}" --mask-src 255.255.0.0 >/dev/null 2>&1 || true
    conntrack -D --orig-dst "${ALL_RANGES%/*}" --mask-dst 255.255.0.0 >/dev/null 2>&1 || true

    # 6. sysctls, cgroups, directories
    if [[ -f $STATE/host/sysctls ]]; then
        local kv k
        while IFS= read -r kv; do
            k=${kv%%=*}
            [[ -f /proc/sys/${k//.//} ]] || continue
            [[ $(sysctl -n "$k") == "${kv#*=}" ]] && continue
            sysctl -qw "$kv" || FAILURES+=("cannot restore sysctl $kv")
        done <"$STATE/host/sysctls"
    fi
    remove_cgroups
    if [[ -f $STATE/host/absent-dirs ]]; then
        local d
        while IFS= read -r d; do
            [[ -e $d ]] || continue
            if [[ $d == /run/netns ]]; then
                rmdir "$d" 2>/dev/null || FAILURES+=("$d is not empty (network namespaces not the node's?)")
            else
                rm -rf "$d" || FAILURES+=("cannot remove $d")
            fi
        done <"$STATE/host/absent-dirs"
    fi

    # 7. the state itself (the record of the host stays while anything failed, for the next `down`)
    if ((${#FAILURES[@]})); then
        find "$STATE" -mindepth 1 -maxdepth 1 ! -name host ! -name logs -exec rm -rf {} + 2>/dev/null || true
        log "down finished with problems (run it again; logs in $STATE/logs):"
        printf '  %s\n' "${FAILURES[@]}" >&2
        return 1
    fi
    rm -rf "$STATE"
    log "down: host restored in $(elapsed "$t0") s"
}

# --- restart: one component, stopped and started again with the same command line ------------------------------
healthy() { # COMPONENT: it answers (what `restart` waits for)
    case $1 in
    etcd) curl -sf --max-time 2 "http://$NODE_IP:2379/health" ;;
    kube-apiserver) api /readyz ;;
    kube-controller-manager) # its health endpoint answers before it has started its controllers (and an API
        # server going away before that stops it for good): until it says it started one
        curl -sfk --max-time 2 "https://$NODE_IP:10257/healthz" &&
            tail -c "+$((LOG_OFFSET + 1))" "$STATE/logs/$1.log" | grep 'Started "' >/dev/null ;;  # all read: no SIGPIPE
    kube-scheduler) curl -sfk --max-time 2 "https://$NODE_IP:10259/healthz" ;;
    containerd) ctr_ version ;;
    dnsmasq) [[ -s $STATE/dns/dnsmasq.pid ]] && kill -0 "$(<"$STATE/dns/dnsmasq.pid")" ;;
    kubelet) curl -sf --max-time 2 "http://$NODE_IP:10248/healthz" && node_ready ;;
    kube-proxy) curl -sf --max-time 2 "http://$NODE_IP:10256/healthz" ;;
    *) true ;;
    esac
}

restart() {
    local name=${1:-} argv h
    [[ " ${COMPONENTS[*]} " == *" $name "* ]] || die "usage: scripts/node.sh restart COMPONENT (one of ${COMPONENTS[*]})"
    check_host
    node_lock
    [[ -f $STATE/ready && -f $STATE/pids/$name.argv ]] || die "the node is not up (scripts/node.sh up)"
    mapfile -d '' argv <"$STATE/pids/$name.argv"
    CGROUPS=()
    for h in $(cgroup_hierarchies); do [[ -d $h/eagle3-node ]] && CGROUPS+=("$h/eagle3-node"); done
    [[ $name == dnsmasq ]] && rm -f "$STATE/dns/dnsmasq.pid"
    local t0
    t0=$(now)
    LOG_OFFSET=$(stat -c %s "$STATE/logs/$name.log" 2>/dev/null || echo 0)
    stop_component "$name" 10
    start "$name" "$(<"$STATE/pids/$name.match")" "${argv[@]}"
    wait_for "$name" 120 healthy "$name"
    log "restarted $name in $(elapsed "$t0") s"
}

# --- load: images from buildah's storage into containerd ---------------------------------------------------
load() {
    (($#)) || die "usage: scripts/node.sh load IMAGE[=ARCHIVE]..."
    is_up || die "the node is not up (scripts/node.sh up)"
    local img id stamp dir=$CTRD_ROOT/eagle3-loaded
    mkdir -p "$dir"
    LOAD_TMP=$(mktemp -d "${TMPDIR:-/tmp}/eagle3-node-load.XXXXXX")
    trap 'rm -rf "$LOAD_TMP"' EXIT
    local arg archive
    for arg in "$@"; do
        # IMAGE (from buildah's storage) or IMAGE=ARCHIVE (an OCI archive of it, e.g. scripts/build-images.sh's)
        img=${arg%%=*} archive=
        [[ $arg == *=* ]] && archive=${arg#*=}
        if [[ -n $archive ]]; then
            [[ -r $archive ]] || die "no archive $archive for $img"
            id=$(stat -c '%s %Y' "$archive")
        else
            id=$(buildah inspect --type image --format '{{.FromImageID}}' "$img") || die "no image $img in buildah"
        fi
        [[ $img == */* ]] || img=localhost/$img
        [[ $img == *:* ]] || img=$img:latest
        stamp=$dir/$(printf '%s' "$img" | sha256sum | cut -c1-16)
        if [[ -f $stamp && $(<"$stamp") == "$id" ]] && has_image "$img"; then
            log "$img is loaded already"
            continue
        fi
        if [[ -z $archive ]]; then
            buildah push --quiet "$img" "oci-archive:$LOAD_TMP/image.tar:$img" >/dev/null
            archive=$LOAD_TMP/image.tar
        fi
        # a pipeline image is GBs: minutes to unpack on 2 cores, beyond ctr_'s 60 s bound
        timeout 1800 ctr --address "$CTRD_SOCK" --namespace k8s.io images import --base-name "${img%:*}" \
            "$archive" >/dev/null
        rm -f "$LOAD_TMP/image.tar"
        has_image "$img" || die "containerd did not import $img"
        echo "$id" >"$stamp"
        log "loaded $img"
    done
}

case ${1:-} in
up) up ;;
down) down ;;
status)
    if is_up; then
        echo "up: $KUBECONFIG_PATH"
    else
        echo "down" && exit 1
    fi
    ;;
env) echo "KUBECONFIG=$KUBECONFIG_PATH" ;;
load) shift && load "$@" ;;
restart) shift && restart "$@" ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2 && exit 2 ;;
esac
