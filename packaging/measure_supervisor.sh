#!/bin/bash
# How one executable behaves as a supervisord program (docs/operations.md, "Under supervisor").
# Usage, from the repository root, after `make dist` (and the one-file build for the second line):
#   packaging/measure_supervisor.sh dist/roq/roq onedir
#   packaging/measure_supervisor.sh dist/roq-onefile onefile
# For stopasgroup=false and =true it runs `BIN up` (ZooKeeper, GCM, host, one queue) as a
# supervisord program on ports 27000-27999 and prints: the process tree under supervisord, which
# PID supervisord watches, the time `supervisorctl stop` takes, the exit status, and how many
# processes are left behind; then the same after SIGKILL of the watched PID. Leftovers are killed afterwards. Only 127.0.0.1 is used.
set -u
bin=$(realpath "$1"); tag=$2
venv=$(dirname "$(realpath "$0")")/../.venv/bin
roq_client=$venv/roq

# A process of this run has the data dir (java, up, host and its children) or the run's
# ZooKeeper port (gcm) in its command line.
run_pattern() { echo "$1|zk.servers=127.0.0.1:27181"; }
count_left() { pgrep -f -- "$(run_pattern "$1")" | wc -l; }
list_run() { pgrep -af -- "$(run_pattern "$1")" | cut -c1-110 | sed 's/^/    /'; }

run_case() {
    local group=$1 how=$2 d=/tmp/roq-supervisor-$tag-$1-$2
    rm -rf "$d"; mkdir -p "$d"
    cat > "$d/supervisord.conf" <<EOF
[unix_http_server]
file=$d/supervisor.sock
[supervisord]
logfile=$d/supervisord.log
pidfile=$d/supervisord.pid
childlogdir=$d
nodaemon=false
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
[supervisorctl]
serverurl=unix://$d/supervisor.sock
[program:roq]
command=$bin up --data-dir $d/data -D zk.servers=127.0.0.1:27181 -D ports.base=27000 -D gcm.ports.base=27000 -D hcm.port=27100 -D monitor.base.port=27500 -D statmonitor.base.port=27800 -D exchange.base.port=27900 -D ports.max.perkind=10
autostart=true
autorestart=false
startsecs=1
stopsignal=TERM
stopwaitsecs=30
stopasgroup=$group
killasgroup=$group
redirect_stderr=true
stdout_logfile=$d/roq.log
EOF
    "$venv/supervisord" -c "$d/supervisord.conf"
    for _ in $(seq 1 600); do grep -q "roq is up" "$d/roq.log" 2>/dev/null && break; sleep 0.05; done
    "$roq_client" queue create sq --gcm 127.0.0.1:27000 > /dev/null || echo "$tag: queue create failed"
    sleep 1
    local watched; watched=$("$venv/supervisorctl" -c "$d/supervisord.conf" pid roq)
    echo "$tag stopasgroup=$group: supervisord watches PID $watched ($(ps -o args= -p "$watched" | cut -c1-60))"
    echo "$tag stopasgroup=$group: $(count_left "$d/data") processes of this run:"
    list_run "$d/data"
    local t0; t0=$(date +%s.%N)
    if [ "$how" = stop ]; then
        "$venv/supervisorctl" -c "$d/supervisord.conf" stop roq | sed "s/^/    supervisorctl: /"
    else  # what the OOM killer, or a stop past stopwaitsecs without killasgroup, does
        kill -KILL "$watched"
        for _ in $(seq 1 100); do
            "$venv/supervisorctl" -c "$d/supervisord.conf" status roq | grep -q RUNNING || break
            sleep 0.05
        done
    fi
    echo "$tag stopasgroup=$group $how: took $(echo "$(date +%s.%N) - $t0" | bc) s;" \
        "$(grep -Eo '(exited|stopped): roq \([^)]*\)' "$d/supervisord.log" | tail -1)"
    local gone=never
    for i in $(seq 1 300); do  # 30 s
        [ "$(count_left "$d/data")" = 0 ] && { gone="$(echo "$i * 0.1" | bc) s"; break; }
        sleep 0.1
    done
    echo "$tag stopasgroup=$group $how: all gone after: $gone; left behind: $(count_left "$d/data")"
    list_run "$d/data"
    "$venv/supervisorctl" -c "$d/supervisord.conf" shutdown > /dev/null
    pkill -KILL -f -- "$(run_pattern "$d/data")"; sleep 0.5
}

run_case false stop
run_case true stop
run_case false kill
