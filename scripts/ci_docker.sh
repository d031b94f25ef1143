#!/usr/bin/env bash
# Make a Docker engine reachable for tests/docker, if this machine can run one.
#
# Contract: idempotent; installs Debian's docker.io when no dockerd is installed (root only), starts
# dockerd in the background when no engine answers, waits for it (bounded), and ALWAYS exits 0.
# When no engine can be started the docker tests skip and print why; this script says why on stderr.
#
# Env: SM12X_DOCKERD_WAIT (seconds to wait for the engine, default 60),
#      SM12X_DOCKERD_LOG (default /tmp/sm12x-dockerd.log).
set -u

WAIT="${SM12X_DOCKERD_WAIT:-60}"
LOG="${SM12X_DOCKERD_LOG:-/tmp/sm12x-dockerd.log}"
SOCK="${DOCKER_HOST:-unix:///var/run/docker.sock}"
SOCK="${SOCK#unix://}"

say() { echo "ci_docker: $*" >&2; }

engine_up() {
    # Ask the engine itself (the CLI may be missing; curl may be missing): a raw HTTP ping on the socket.
    [ -S "$SOCK" ] || return 1
    python3 - "$SOCK" <<'EOF' >/dev/null 2>&1
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(3)
s.connect(sys.argv[1])
s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
sys.exit(0 if b" 200 " in s.recv(256) else 1)
EOF
}

if engine_up; then
    say "engine already answering on $SOCK"
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        say "dockerd not installed and not root: cannot install docker.io; docker tests will skip"
        exit 0
    fi
    say "installing Debian docker.io"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io; } >/tmp/sm12x-apt-docker.log 2>&1; then
        say "apt-get install docker.io failed (see /tmp/sm12x-apt-docker.log); docker tests will skip"
        exit 0
    fi
fi

if [ "$(id -u)" != 0 ]; then
    say "no engine on $SOCK and not root: cannot start dockerd; docker tests will skip"
    exit 0
fi

start_dockerd() {  # $@: extra dockerd flags
    say "starting dockerd $* (log: $LOG)"
    # setsid: the engine outlives this script and the CI step that called it.
    setsid nohup dockerd --host "unix://$SOCK" "$@" >>"$LOG" 2>&1 </dev/null &
    DOCKERD_PID=$!
}

wait_engine() {  # $1: seconds; fails early when the dockerd we started has exited
    for _ in $(seq 1 "$1"); do
        engine_up && return 0
        if [ -n "${DOCKERD_PID:-}" ] && ! kill -0 "$DOCKERD_PID" 2>/dev/null; then
            return 1
        fi
        sleep 1
    done
    return 1
}

DOCKERD_PID=
if pgrep -x dockerd >/dev/null 2>&1; then
    say "dockerd already running; waiting for it to answer"
else
    start_dockerd
fi
if wait_engine "$WAIT"; then
    say "engine up on $SOCK"
    exit 0
fi

# Sandboxes without iptables/bridge support: the tests need neither (their containers run with
# networking disabled), so retry once without them.
if [ -n "$DOCKERD_PID" ] && ! kill -0 "$DOCKERD_PID" 2>/dev/null; then
    start_dockerd --iptables=false --ip6tables=false --bridge=none
    if wait_engine "$WAIT"; then
        say "engine up on $SOCK (without iptables/bridge networking)"
        exit 0
    fi
fi

say "engine did not answer within ${WAIT}s; docker tests will skip. Last lines of $LOG:"
tail -n 5 "$LOG" >&2 2>/dev/null || true
exit 0
