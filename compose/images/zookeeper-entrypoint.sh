#!/bin/sh
# Writes zoo.cfg from ZOO_MY_ID (default 1) and ZOO_SERVERS ("server.1=zk1:2888:3888;2181
# server.2=..."; none: standalone), as the official image does, then runs the server in
# the foreground. The four-letter commands the harness and the bench use are allowed.
set -eu
data=/var/lib/zookeeper/data
mkdir -p "$data"
echo "${ZOO_MY_ID:-1}" > "$data/myid"
cfg=/etc/zookeeper/zoo.cfg
{
  echo "tickTime=2000"
  echo "initLimit=10"
  echo "syncLimit=5"
  echo "dataDir=$data"
  echo "clientPort=2181"
  echo "admin.enableServer=false"
  echo "4lw.commands.whitelist=srvr,ruok,mntr,cons,stat"
  for server in ${ZOO_SERVERS:-}; do
    echo "$server"
  done
} > "$cfg"
classpath=/usr/share/java/zookeeper.jar
[ -f /usr/share/java/slf4j-simple.jar ] && classpath="$classpath:/usr/share/java/slf4j-simple.jar"
exec java -Xmx512m -cp "$classpath" org.apache.zookeeper.server.quorum.QuorumPeerMain "$cfg"
