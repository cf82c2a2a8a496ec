#!/usr/bin/env bash
# Idempotent setup for a fresh clone on a fresh machine: a virtualenv with the project
# and every extra, and (when we are root and it is missing) Debian's ActiveMQ for the
# interop tests. Re-running it does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.amq-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[all]"
    echo "$want" > "$stamp"
fi

if [ "${AMQ_SKIP_ACTIVEMQ:-0}" != "1" ] && [ ! -f /usr/share/activemq/bin/activemq.jar ]; then
    if [ "$(id -u)" = "0" ]; then
        echo "setup: installing Debian's activemq package for the interop tests" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq activemq >/dev/null
    else
        echo "setup: not root, ActiveMQ interop tests will be skipped (apt-get install -y activemq)" >&2
    fi
fi

# Debian's chromium and chromium-driver for the console's real-browser test (tests/http/test_browser.py)
if [ "${AMQ_SKIP_CHROMIUM:-0}" != "1" ] && { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; }; then
    if [ "$(id -u)" = "0" ]; then
        echo "setup: installing Debian's chromium and chromium-driver for the console's browser test" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    else
        echo "setup: not root, the console's browser test will be skipped (apt-get install -y chromium chromium-driver)" >&2
    fi
fi

# Debian's rabbitmq-server (with its STOMP plugin) for the RabbitMQ interop tests; the tests
# run their own loopback-only node (amqtransport/testing/rabbitmq.py), never the system service
if [ "${AMQ_SKIP_RABBITMQ:-0}" != "1" ] && [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
    if [ "$(id -u)" = "0" ]; then
        echo "setup: installing Debian's rabbitmq-server for the RabbitMQ interop tests" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
    else
        echo "setup: not root, RabbitMQ interop tests will be skipped (apt-get install -y rabbitmq-server)" >&2
    fi
fi

# Debian's faketime (libfaketime) for the clock-skew test of a replicated pair (tests/ha/test_clock_skew.py)
if [ "${AMQ_SKIP_FAKETIME:-0}" != "1" ] && ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ]; then
        echo "setup: installing Debian's faketime for the clock-skew test" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null
    else
        echo "setup: not root, the clock-skew test will be skipped (apt-get install -y faketime)" >&2
    fi
fi

# Debian's nftables (the nemesis's kernel partitions between network namespaces) and libfuse2
# (its LazyFS power-loss fault, through fusepy): chaos/nemesis/netns.py, chaos/nemesis/lazyfs.py
if [ "${AMQ_SKIP_NEMESIS_KERNEL:-0}" != "1" ] && { ! command -v nft >/dev/null 2>&1 || ! ls /usr/lib/*/libfuse.so.2 >/dev/null 2>&1; }; then
    if [ "$(id -u)" = "0" ]; then
        echo "setup: installing Debian's nftables and libfuse2 for the nemesis's partition and power-loss faults" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables libfuse2 >/dev/null
    else
        echo "setup: not root, the nemesis's partition and power-loss faults will be skipped (apt-get install -y nftables libfuse2)" >&2
    fi
fi

# The real @stomp/stompjs from npm for the browser test of the WebSocket port
# (tests/http/test_websocket_browser.py); kept in .venv, never in the repository
STOMPJS_VERSION=7.5.0
if [ "${AMQ_SKIP_STOMPJS:-0}" != "1" ] && [ ! -f ".venv/npm/node_modules/@stomp/stompjs/bundles/stomp.umd.min.js" ]; then
    if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
        echo "setup: installing Debian's npm for the WebSocket browser test" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
    fi
    if command -v npm >/dev/null 2>&1; then
        echo "setup: installing @stomp/stompjs@$STOMPJS_VERSION from npm into .venv/npm" >&2
        npm install --silent --prefix .venv/npm --no-save --no-audit --no-fund "@stomp/stompjs@$STOMPJS_VERSION" >/dev/null \
            || echo "setup: npm install of @stomp/stompjs failed: the WebSocket browser test will be skipped" >&2
    else
        echo "setup: no npm: the WebSocket browser test will be skipped (apt-get install -y npm)" >&2
    fi
fi
