#!/bin/bash
# HTTP gateway bench (docs/benchmarks.md, "HTTP gateway on the state log"): roq with its topics in
# the state log, a second gateway on delivery.state=zookeeper, and the Redis model with AOF
# everysec, interleaved. COUNT, ROUNDS, TOPICS from the environment. Needs redis-server.
set -u
cd /work/main
export PYTHONPATH=appliance
D=/tmp/hb; rm -rf $D; mkdir -p $D
redis-server --port 40699 --save '' --appendonly yes --appendfsync everysec --dir $D --daemonize yes
.venv/bin/python -m roq up --data-dir $D/data \
  -D zk.servers=127.0.0.1:40681 -D ports.base=40600 -D hcm.port=40610 -D http.port=40680 \
  -D monitor.base.port=40700 -D statmonitor.base.port=40800 -D exchange.base.port=40900 > $D/up.log 2>&1 &
UP=$!
for i in $(seq 1 120); do grep -q "roq is up" $D/up.log && break; sleep 0.5; done
export ROQ_HOME=$D/data
export ROQ_TOKEN=$(.venv/bin/python -m roq keys token)
.venv/bin/python -m roq http -D zk.servers=127.0.0.1:40681 -D http.port=40690 -D delivery.state=zookeeper \
  -D security.dir=$D/data/security -D directory=$D/data/log > $D/http-zk.log 2>&1 &
for i in $(seq 1 60); do curl -s -o /dev/null -H "Authorization: Bearer $ROQ_TOKEN" localhost:40690/metrics && break; sleep 0.5; done
GW=$(pgrep -f "roq http .*40680" | head -1)
GWZ=$(pgrep -f "roq http .*40690" | head -1)
MON=$(pgrep -f "roq monitor http-0" | head -1)
ZK=$(pgrep -f "zookeeper.*$D" | head -1)
echo "gw=$GW gwz=$GWZ mon=$MON zk=$ZK"
.venv/bin/python benchmarks/http_bench.py --roq http://127.0.0.1:40680 --roq-pid $GW \
  --roq-zk http://127.0.0.1:40690 --roq-zk-pid $GWZ --cpu-pid monitor=$MON --cpu-pid zookeeper=$ZK \
  --redis-port 40699 --model-port 40697 --count ${COUNT:-1000} --topics ${TOPICS:-2000} --rounds ${ROUNDS:-2} \
  --zk-pid $ZK > $D/bench.out 2>&1
echo "bench exit $?"
kill $GWZ; kill $UP; wait $UP
redis-cli -p 40699 shutdown nosave
