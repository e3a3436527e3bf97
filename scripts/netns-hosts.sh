#!/bin/sh
# Two "hosts" on one machine for multi-host MPI runs: two network namespaces, each process in them
# with its own host name (a UTS namespace), joined by a veth pair on a private /30, and a
# remote-shell agent through which mpirun starts its daemon on the other host.
#
#   scripts/netns-hosts.sh [-n RANKS_PER_HOST] [--rate-mbit M] mpirun [MPIRUN ARGS] PROGRAM [ARGS]
#       mpirun on host A with -H A:n,B:n -np 2n, the agent, TCP on the pair's subnet only, and
#       -x for every TANDEM_* variable set; then the hosts are torn down. Exit status: mpirun's.
#   scripts/netns-hosts.sh [-n RANKS_PER_HOST] [--rate-mbit M] run COMMAND [ARGS]
#       COMMAND on host A, with NETNS_HOSTS ("A B"), NETNS_SUBNET (a.b.c.d/30), NETNS_AGENT and
#       NETNS_MPIRUN (the mpirun words above, without -np's program) in its environment.
#
# --rate-mbit M limits each direction of the pair to M Mbit/s (a token bucket, `tc qdisc ... tbf`,
# on both ends): a model of a network link whose transfers take wire time but no CPU, as a NIC's
# do. Without it the pair is as fast as the kernel copies.
#
# Needs root, `ip` (iproute2) and `unshare` (util-linux). Where the namespaces cannot be made the
# script prints "netns-hosts: skipped: <why>" and exits 77 (CTest's and automake's skip status).
# Every namespace, interface and file it made is removed on exit, also when COMMAND fails or the
# script is interrupted; processes still running inside the namespaces are killed first.
#
# Names carry the script's pid (tmh<pid>a, tmh<pid>b) so that several runs at once do not meet;
# the /30 is 10.213.X.Y derived from the pid as well (the namespaces see no other network, so the
# pair's addresses need only differ from nothing else but each other).
set -u

ranks=2
rate_mbit=
while [ $# -gt 0 ]; do
  case $1 in
    --rate-mbit) [ $# -ge 2 ] || { echo "netns-hosts: error: --rate-mbit needs a rate in Mbit/s" >&2; exit 2; }
        case $2 in ''|*[!0-9]*|0) echo "netns-hosts: error: --rate-mbit '$2': the rate must be a whole number of Mbit/s, 1 or more" >&2; exit 2;; esac
        rate_mbit=$2; shift 2;;
    -n) [ $# -ge 2 ] || { echo "netns-hosts: error: -n needs a number of ranks per host" >&2; exit 2; }
        case $2 in ''|*[!0-9]*|0) echo "netns-hosts: error: -n '$2': ranks per host must be a whole number of 1 or more" >&2; exit 2;; esac
        ranks=$2; shift 2;;
    *) break;;
  esac
done
mode=${1-}
case $mode in
  mpirun|run) shift;;
  *) echo "netns-hosts: error: usage: $0 [-n RANKS_PER_HOST] [--rate-mbit M] mpirun [MPIRUN ARGS] PROGRAM [ARGS] | run COMMAND [ARGS]" >&2; exit 2;;
esac
[ $# -gt 0 ] || { echo "netns-hosts: error: '$mode' needs a command to run" >&2; exit 2; }

skip() { echo "netns-hosts: skipped: $*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "network namespaces need root (running as uid $(id -u))"
command -v ip >/dev/null 2>&1 || skip "no 'ip' command (install iproute2)"
command -v unshare >/dev/null 2>&1 || skip "no 'unshare' command (install util-linux)"
if [ "$mode" = mpirun ]; then
  command -v mpirun >/dev/null 2>&1 || skip "no 'mpirun' on PATH"
fi

id=$$
host_a=tmh${id}a
host_b=tmh${id}b
ns_a=$host_a
ns_b=$host_b
# 10.213.0.0/16 holds 16384 /30s; the pid picks one.
slot=$((id % 16384))
net="10.213.$((slot / 64)).$(((slot % 64) * 4))"
addr_a="10.213.$((slot / 64)).$(((slot % 64) * 4 + 1))"
addr_b="10.213.$((slot / 64)).$(((slot % 64) * 4 + 2))"
subnet="$net/30"
dir=$(mktemp -d "${TMPDIR:-/tmp}/netns-hosts.$id.XXXXXX") || { echo "netns-hosts: error: cannot make a temporary folder" >&2; exit 1; }
agent=$dir/agent

child=
# The first `ip netns add` on a machine makes /run/netns a mount point of its own; one this run
# made goes again with the run (a chroot's copy must be removable afterwards).
mountpoint -q /run/netns 2>/dev/null && netns_mounted_before=1 || netns_mounted_before=0
teardown() {
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
  for ns in $ns_a $ns_b; do
    if ip netns list 2>/dev/null | grep -q "^$ns\b"; then
      # What is left inside (a rank mpirun did not end) dies with it; these are our processes.
      pids=$(ip netns pids "$ns" 2>/dev/null)
      [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
      ip netns del "$ns" 2>/dev/null || echo "netns-hosts: warning: could not delete namespace $ns" >&2
    fi
  done
  # Deleting a namespace destroys its end of the pair, and with it the other end; should the pair
  # still be in this namespace (set-up failed before it moved), remove it here.
  ip link del "$host_a" 2>/dev/null
  # (`ip netns del` leaves /etc/netns alone)
  rm -rf "/etc/netns/$ns_a" "/etc/netns/$ns_b" "$dir"
  rmdir /etc/netns 2>/dev/null
  if [ "$netns_mounted_before" = 0 ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
    umount /run/netns 2>/dev/null
  fi
}
trap 'teardown' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ip's own error is the one clear message; a namespace we may not make is a skip, not a failure.
ip netns add "$ns_a" 2>"$dir/err" || skip "cannot create a network namespace: $(cat "$dir/err")"
ip netns add "$ns_b" 2>"$dir/err" || skip "cannot create a network namespace: $(cat "$dir/err")"
# Entering one makes a mount namespace and remounts /sys in it: inside a chroot whose root is not
# a mount point (a fresh-machine check) that fails, and no host can be entered.
ip netns exec "$ns_a" true 2>"$dir/err" || skip "cannot enter a network namespace: $(cat "$dir/err")"
fail() { echo "netns-hosts: error: $*" >&2; exit 1; }
ip link add "$host_a" type veth peer name "$host_b" 2>"$dir/err" || skip "cannot create a veth pair: $(cat "$dir/err")"
ip link set "$host_a" netns "$ns_a" || fail "cannot move $host_a into $ns_a"
ip link set "$host_b" netns "$ns_b" || fail "cannot move $host_b into $ns_b"
ip -n "$ns_a" addr add "$addr_a/30" dev "$host_a" || fail "cannot give $host_a the address $addr_a/30"
ip -n "$ns_b" addr add "$addr_b/30" dev "$host_b" || fail "cannot give $host_b the address $addr_b/30"
for ns in $ns_a $ns_b; do
  ip -n "$ns" link set lo up || fail "cannot bring up lo in $ns"
done
ip -n "$ns_a" link set "$host_a" up || fail "cannot bring up $host_a"
ip -n "$ns_b" link set "$host_b" up || fail "cannot bring up $host_b"
link=unlimited
if [ -n "$rate_mbit" ]; then
  link="$rate_mbit Mbit/s each way"
  command -v tc >/dev/null 2>&1 || skip "--rate-mbit needs 'tc' (install iproute2)"
  # The bucket holds 10 ms of the rate (at least 64 KiB): enough for the kernel's timer to keep
  # the link busy, small enough that the rate, not the burst, sets a message's time.
  burst=$((rate_mbit * 1250))
  [ "$burst" -ge 65536 ] || burst=65536
  for end in "$ns_a $host_a" "$ns_b $host_b"; do
    ns=${end% *}; dev=${end#* }
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "${rate_mbit}mbit" burst "$burst" latency 100ms \
      2>"$dir/err" || skip "cannot limit $dev to $rate_mbit Mbit/s: $(cat "$dir/err")"
  done
fi
unshare --uts true 2>"$dir/err" || skip "cannot create a UTS namespace: $(cat "$dir/err")"
# Each host resolves both names (ip netns exec puts /etc/netns/<ns>/hosts over /etc/hosts).
for ns in $ns_a $ns_b; do
  # (twice: another run's teardown may remove an empty /etc/netns between our two mkdirs)
  mkdir -p "/etc/netns/$ns" 2>/dev/null || mkdir -p "/etc/netns/$ns" || fail "cannot create /etc/netns/$ns"
  printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "$addr_a" "$host_a" "$addr_b" "$host_b" >"/etc/netns/$ns/hosts"
done

# The remote shell: like ssh HOST COMMAND, the words after the host joined into one shell command
# line, run on that host (its network namespace, a fresh UTS namespace named after it).
cat >"$agent" <<EOF
#!/bin/sh
# mpirun's remote-shell agent for the two namespaced hosts $host_a and $host_b.
host=\$1
case \$host in
  $host_a) ns=$ns_a;;
  $host_b) ns=$ns_b;;
  *) echo "netns-hosts agent: error: unknown host '\$host' (the hosts are $host_a and $host_b)" >&2; exit 255;;
esac
shift
exec ip netns exec "\$ns" unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$1"' "\$host" "\$*"
EOF
chmod +x "$agent"

ip -n "$ns_a" route get "$addr_b" >/dev/null 2>&1 || fail "$host_a ($addr_a) has no route to $host_b ($addr_b)"

np=$((2 * ranks))
# The two hosts share this machine's cores: no rank is bound to one (each host's ranks would be
# bound to the same cores as the other's), and a waiting rank yields its core.
mpirun_words="mpirun --allow-run-as-root -H $host_a:$ranks,$host_b:$ranks -np $np --bind-to none --mca mpi_yield_when_idle 1 --mca plm_rsh_agent $agent --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,self --mca btl_tcp_if_include $subnet --mca oob_tcp_if_include $subnet"
for v in $(env | sed -n 's/^\(TANDEM_[A-Za-z0-9_]*\)=.*/\1/p'); do
  mpirun_words="$mpirun_words -x $v"
done

echo "netns-hosts: $host_a ($addr_a) and $host_b ($addr_b) on $subnet, ranks per host: $ranks, link: $link" >&2
export NETNS_HOSTS="$host_a $host_b" NETNS_SUBNET="$subnet" NETNS_AGENT="$agent" NETNS_MPIRUN="$mpirun_words"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "$mode" = mpirun ]; then
  set -- sh -c 'exec $NETNS_MPIRUN "$@"' mpirun "$@"
fi
# Host A: its network namespace, its own host name. In the background, so that a signal to this
# script runs the traps at once (sh runs them only after a foreground command ends); its standard
# input is still this script's (a background command's would be /dev/null).
exec 3<&0
ip netns exec "$ns_a" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host_a" "$@" <&3 3<&- &
child=$!
wait $child
exit $?
