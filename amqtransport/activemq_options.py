"""ActiveMQ 5.17's client options: what each one means over STOMP, or why it means nothing.

Theory of operation
-------------------
People bring the URI of their Java configuration.  ActiveMQ's client takes an option when
a bean setter of the object it configures has that name (``IntrospectionSupport``):
``TcpTransport`` / ``SslTransport`` and the ``InactivityMonitor`` for a broker URI,
``OpenWireFormatFactory`` for ``wireFormat.*``, ``java.net.Socket`` / ``SSLSocket`` for
``socket.*``, ``FailoverTransport`` for ``failover:``, ``SimpleDiscoveryAgent`` for
``static:`` / ``masterslave:``, and ``ActiveMQConnectionFactory`` (with its prefetch,
redelivery and blob policies) for ``jms.*`` on the URI's outermost node.  This module is
that list, written out (``tests/uri/test_uri_oracle.py`` checks it against the jar), with,
for every option, either what it *became* here or why it is *ignored*.

* :func:`lookup` resolves a written name the way ActiveMQ does: a prefix (``jms.``,
  ``wireFormat.``, ``socket.``, ``prefetchPolicy.``...) must match exactly, the first
  letter after it may be either case (``Randomize`` is ``setRandomize``), everything
  else is case-sensitive; the factory-level names ``soWriteTimeout`` and
  ``useInactivityMonitor`` are read from the option map by ActiveMQ, so they are exact.
* :func:`java_value_error` checks a value as ActiveMQ's type conversion would
  (``Integer.valueOf`` and friends: ranges, no spaces), except that booleans must be
  ``true`` / ``false`` (any case): ActiveMQ reads every other word as false, which would
  let a typo pass.
* Options that change behaviour and have a field in ``options.py`` carry its name
  (``field``) and are validated by that model; the others are kept on the parsed tree as
  ``(name, value)`` pairs (``LeafUri.amq`` / ``CompositeUri.amq``) and read back by the
  helpers at the end (:func:`heartbeat_of`, :func:`socket_settings`,
  :func:`prefetch_policy`, :func:`jms_credentials`).

Pure: no I/O; the link (``transports/link.py``, ``aio_link.py``, ``_backends/sockets.py``)
applies what the helpers return.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AmqOption",
    "Scope",
    "TRANSPORT",
    "FAILOVER",
    "STATIC",
    "JMS",
    "OWN_MEANINGS",
    "lookup",
    "java_value_error",
    "meaning_of",
    "heartbeat_of",
    "socket_settings",
    "SocketSettings",
    "prefetch_policy",
    "jms_credentials",
    "MONITOR_OPTIONS",
    "TABLES",
    "bean_match",
    "bean_key",
    "conflict",
    "first_deadline_grace_ms",
]

Scope = Literal["transport", "failover", "static", "jms"]


@dataclass(frozen=True)
class AmqOption:
    """One ActiveMQ option: its name (as ActiveMQ's bean name, prefix included), its Java
    type, and either ``became`` (what it does here) or ``ignored`` (why nothing)."""

    name: str
    java: str
    became: str = ""
    ignored: str = ""
    #: the field of our option model it sets (validated there), if any
    field: str | None = None
    #: ssl:// and nio+ssl:// broker URIs only
    ssl_only: bool = False
    #: ActiveMQ reads it from the option map by its exact name (no bean rule)
    exact: bool = False
    #: tcp:// and nio:// only (an SSLSocket refuses it)
    plain_only: bool = False


def _b(name: str, java: str, became: str, **kw: object) -> AmqOption:
    return AmqOption(name, java, became=became, **kw)  # type: ignore[arg-type]


def _i(name: str, java: str, why: str, **kw: object) -> AmqOption:
    return AmqOption(name, java, ignored=why, **kw)  # type: ignore[arg-type]


_TRACE = "ActiveMQ's TransportLogger/JMX view of OpenWire commands; log amqtransport at DEBUG instead"
_OPENWIRE = "an OpenWire encoding setting; STOMP frames are text with their own limits"
_THREAD = "a setting of ActiveMQ's Java reader thread; our reader is a Python thread (or an asyncio task)"
_MONITOR = ("a knob of ActiveMQ's InactivityMonitor; over STOMP the heart-beat is set by "
            "wireFormat.maxInactivityDuration (or heartBeat)")
_REDELIVERY = ("redelivery is the broker's job over STOMP: a NACK (or a lost consumer) hands the message back "
               "and the broker's redelivery policy (ActiveMQ's redeliveryPlugin, our broker's max_redeliveries "
               "and dead-letter queue) decides when and how often it comes back")
_SERVER_TLS = "a TLS server's setting; this end is always the TLS client"

TRANSPORT: tuple[AmqOption, ...] = (
    _b("connectionTimeout", "int", "the connect timeout (our connectTimeout), ms; 0: no limit",
       field="connect_timeout"),
    _b("keepAlive", "Boolean", "SO_KEEPALIVE on the socket"),
    _b("tcpNoDelay", "Boolean", "TCP_NODELAY on the socket (on unless false)"),
    _b("socketBufferSize", "int", "SO_RCVBUF and SO_SNDBUF of the socket, bytes"),
    _b("soLinger", "int", "SO_LINGER of the socket, seconds (-1: off)"),
    _b("soWriteTimeout", "long", "a write blocked this long fails the link, ms (0: our 30 s guard)", exact=True),
    _b("typeOfService", "tos", "IP_TOS of the socket (0-255)"),
    _b("diffServ", "dscp", "IP_TOS of the socket from a DiffServ class (EF, AF11..AF43, CS0..CS7 or 0-63)"),
    _b("useInactivityMonitor", "boolean", "false: no heart-beats (heart-beat 0,0) unless heartBeat is given",
       exact=True),
    _b("verifyHostName", "Boolean", "false: TLS does not check the certificate's host name (it still checks "
       "the chain unless verify=false)", ssl_only=True),
    _i("soTimeout", "int", "ActiveMQ's reader only wakes up after soTimeout and reads on; ours waits with "
       "the heart-beat deadline, so there is nothing to set"),
    _i("ioBufferSize", "int", "the size of ActiveMQ's buffered streams; our reader reads up to 64 KiB a call"),
    _i("closeAsync", "boolean", "whether ActiveMQ closes its socket on another thread; ours closes at once"),
    _i("daemon", "boolean", _THREAD),
    _i("stackSize", "long", _THREAD),
    _i("trace", "boolean", _TRACE),
    _i("logWriterName", "String", _TRACE),
    _i("dynamicManagement", "boolean", _TRACE),
    _i("startLogging", "boolean", _TRACE),
    _i("jmxPort", "int", _TRACE),
    _i("useLocalHost", "boolean", "ActiveMQ's trick of naming the local host 'localhost'; we connect to the "
       "host as written"),
    _i("minmumWireFormatVersion", "int", "OpenWire version negotiation; STOMP negotiates 1.0-1.2 in CONNECT"),
    _i("negotiateTimeout", "long", "bounds OpenWire's WireFormatInfo exchange; the STOMP handshake is bounded "
       "by connectTimeout"),
    # the WriteTimeoutFilter's, which soWriteTimeout puts on top (and then takes the options negotiateTimeout's
    # layer would have: ActiveMQ refuses negotiateTimeout next to soWriteTimeout)
    _b("writeTimeout", "long", "with soWriteTimeout: the write timeout, ms (it wins over soWriteTimeout's value)"),
    _i("sleep", "long", "with soWriteTimeout: how often ActiveMQ's filter checks its writes; ours are bounded "
       "by the socket"),
    # the InactivityMonitor's own knobs (refused by ActiveMQ once useInactivityMonitor=false)
    _i("connectAttemptTimeout", "long", _MONITOR),
    _i("ignoreAllWireFormatInfo", "boolean", _MONITOR),
    _i("ignoreRemoteWireFormat", "boolean", _MONITOR),
    _i("initialDelayTime", "long", _MONITOR),
    _i("keepAliveResponseRequired", "boolean", _MONITOR),
    _i("readCheckTime", "long", _MONITOR),
    _i("writeCheckTime", "long", _MONITOR),
    _i("useKeepAlive", "boolean", _MONITOR),
    # wireFormat.* (OpenWireFormatFactory)
    _b("wireFormat.maxInactivityDuration", "long", "the STOMP heart-beat: CONNECT offers heart-beat D,D "
       "(0: none); heartBeat wins when given"),
    _b("wireFormat.maxInactivityDurationInitalDelay", "long", "the first heart-beat deadline comes no sooner "
       "than this after CONNECTED, ms"),
    *(_i(f"wireFormat.{n}", t, _OPENWIRE) for n, t in (
        ("cacheEnabled", "boolean"), ("cacheSize", "int"), ("host", "String"), ("includePlatformDetails", "boolean"),
        ("maxFrameSize", "long"), ("maxFrameSizeEnabled", "boolean"), ("platformDetails", "String"),
        ("providerName", "String"), ("providerVersion", "String"), ("sizePrefixDisabled", "boolean"),
        ("stackTraceEnabled", "boolean"), ("tcpNoDelayEnabled", "boolean"), ("tightEncodingEnabled", "boolean"),
        ("version", "openwire"))),
    # socket.* (java.net.Socket, then javax.net.ssl.SSLSocket on ssl:// and nio+ssl://)
    _b("socket.keepAlive", "boolean", "SO_KEEPALIVE on the socket"),
    _b("socket.tcpNoDelay", "boolean", "TCP_NODELAY on the socket"),
    _b("socket.receiveBufferSize", "int", "SO_RCVBUF of the socket, bytes"),
    _b("socket.sendBufferSize", "int", "SO_SNDBUF of the socket, bytes"),
    _b("socket.trafficClass", "tos", "IP_TOS of the socket (0-255)"),
    _i("socket.soTimeout", "int", "see soTimeout: our reader waits with the heart-beat deadline"),
    _i("socket.reuseAddress", "boolean", "a client socket binds no fixed local port"),
    _i("socket.OOBInline", "boolean", "TCP urgent data has no use in STOMP", plain_only=True),
    _b("socket.verifyHostName", "boolean", "false: TLS does not check the certificate's host name",
       ssl_only=True, exact=True),  # SslTransport takes it out of socket.* by this exact name
    _b("socket.enabledProtocols", "protocols", "the TLS versions allowed (e.g. TLSv1.2,TLSv1.3: the lowest and "
       "highest named bound the handshake)", ssl_only=True),
    _i("socket.enabledCipherSuites", "ciphers", "Java's cipher-suite names; Python's ssl module takes "
       "OpenSSL's, so OpenSSL's defaults apply", ssl_only=True),
    _i("socket.needClientAuth", "boolean", _SERVER_TLS, ssl_only=True),
    _i("socket.wantClientAuth", "boolean", _SERVER_TLS, ssl_only=True),
    _i("socket.useClientMode", "boolean", _SERVER_TLS, ssl_only=True),
    _i("socket.enableSessionCreation", "boolean", "TLS session resumption is left to OpenSSL", ssl_only=True),
)

_OPENWIRE_CONTROL = "a broker's ConnectionControl command (OpenWire); a STOMP broker sends none"
FAILOVER: tuple[AmqOption, ...] = (
    *(_b(n, t, "", field=f) for n, t, f in (
        ("randomize", "boolean", "randomize"), ("initialReconnectDelay", "long", "initial_reconnect_delay"),
        ("maxReconnectDelay", "long", "max_reconnect_delay"),
        ("useExponentialBackOff", "boolean", "use_exponential_backoff"),
        ("reconnectDelayExponent", "double", "reconnect_delay_exponent"),
        ("maxReconnectAttempts", "int", "max_reconnect_attempts"),
        ("startupMaxReconnectAttempts", "int", "startup_max_reconnect_attempts"), ("timeout", "long", "timeout"),
        ("priorityBackup", "boolean", "priority_backup"), ("priorityURIs", "String", "priority_uris"),
        ("backup", "boolean", "backup"), ("backupPoolSize", "int", "backup_pool_size"),
        ("trackMessages", "boolean", "track_messages"), ("maxCacheSize", "int", "max_cache_size"),
        ("warnAfterReconnectAttempts", "int", "warn_after_reconnect_attempts"),
        ("updateURIsURL", "String", "update_uris_url"))),
    _i("updateURIsSupported", "boolean", _OPENWIRE_CONTROL + " (updateURIsURL reads a list from a file or URL)"),
    _i("rebalanceUpdateURIs", "boolean", _OPENWIRE_CONTROL),
    _i("reconnectSupported", "boolean", _OPENWIRE_CONTROL + "; we always reconnect"),
    _i("trackTransactionProducers", "boolean", "replays OpenWire producer state of transactions; here a "
       "transaction open across a failover fails its commit (docs/reliability.md)"),
    _i("reconnectDelay", "long", "ActiveMQ's current delay, reset to initialReconnectDelay on start: set "
       "initialReconnectDelay"),
    _i("nestedExtraQueryOptions", "String", "ActiveMQ's internal form of nested.*: write nested.X=v"),
)

STATIC: tuple[AmqOption, ...] = tuple(_b(n, t, "", field=f) for n, t, f in (
    ("initialReconnectDelay", "long", "initial_reconnect_delay"), ("maxReconnectDelay", "long", "max_reconnect_delay"),
    ("useExponentialBackOff", "boolean", "use_exponential_backoff"), ("backOffMultiplier", "long", "backoff_multiplier"),
    ("maxReconnectAttempts", "int", "max_reconnect_attempts"), ("minConnectTime", "long", "min_connect_time")))

_JMS_ONLY = "a JMS client setting with no STOMP counterpart"
JMS: tuple[AmqOption, ...] = (
    _b("jms.prefetchPolicy.all", "int", "the prefetch of every subscription (0, a pull consumer, becomes 1)"),
    _b("jms.prefetchPolicy.queuePrefetch", "int", "the prefetch of queue subscriptions (0 becomes 1)"),
    _b("jms.prefetchPolicy.topicPrefetch", "int", "the prefetch of topic subscriptions (0 becomes 1)"),
    _b("jms.prefetchPolicy.durableTopicPrefetch", "int", "the prefetch of durable topic subscriptions "
       "(0 becomes 1)"),
    _b("jms.prefetchPolicy.queueBrowserPrefetch", "int", "the prefetch of a queue browser (a subscription with browser:true; 0 becomes 1)"),
    _i("jms.prefetchPolicy.optimizeDurableTopicPrefetch", "int", "OpenWire's optimized durable dispatch"),
    _i("jms.prefetchPolicy.maximumPendingMessageLimit", "int", "a broker-side limit for slow topic consumers "
       "(set on the broker's policy)"),
    _b("jms.clientID", "String", "the CONNECT client-id (connect(client_id=...) wins; a durable subscription still needs connect(client_id=...))"),
    _b("jms.userName", "String", "the CONNECT login (connect(login=...) wins)"),
    _b("jms.password", "String", "the CONNECT passcode (connect(passcode=...) wins)"),
    _i("jms.useAsyncSend", "boolean", "Connection.send returns once the broker's receipt is in (our "
       "at-least-once contract); ActiveMQ's async send is closest to conn.producer(window=N) (pipelined, "
       "still receipted) or send(..., receipt=False)"),
    _i("jms.alwaysSyncSend", "boolean", "every send already waits for its receipt"),
    _i("jms.sendTimeout", "int", "pass send(..., timeout=S): a send's deadline is per call here"),
    _i("jms.useCompression", "boolean", "OpenWire body compression; STOMP bodies go as they are"),
    _i("jms.messagePrioritySupported", "boolean", "consumer-side priority ordering; the broker orders by "
       "priority (send(..., priority=N))"),
    _i("jms.watchTopicAdvisories", "boolean", "ActiveMQ's client watches advisory topics for temporary "
       "destinations; ours subscribes to none"),
    _i("jms.exclusiveConsumer", "boolean", "per subscription here: subscribe(headers={'activemq.exclusive': "
       "'true'})"),
    _i("jms.copyMessageOnSend", "boolean", "a sent body is serialized at once; there is no message object to copy"),
    _i("jms.checkForDuplicates", "boolean", "the duplicate filter is always on (amq-idempotency-key)"),
    _i("jms.auditDepth", "int", "the duplicate filter's size is fixed here"),
    _i("jms.auditMaximumProducerNumber", "int", "the duplicate filter's size is fixed here"),
    _i("jms.brokerURL", "uri", "the URI itself is the broker URL (ActiveMQ would put this one in its place, "
       "keeping the other options)"),
    *(_i(f"jms.{n}", t, _JMS_ONLY) for n, t in (
        ("alwaysSessionAsync", "boolean"), ("clientIDPrefix", "String"), ("closeTimeout", "int"),
        ("connectResponseTimeout", "int"), ("connectionIDPrefix", "String"), ("consumerExpiryCheckEnabled", "boolean"),
        ("consumerFailoverRedeliveryWaitPeriod", "long"), ("disableTimeStampsByDefault", "boolean"),
        ("dispatchAsync", "boolean"), ("maxThreadPoolSize", "int"), ("nestedMapAndListEnabled", "boolean"),
        ("nonBlockingRedelivery", "boolean"), ("objectMessageSerializationDefered", "boolean"),
        ("optimizeAcknowledge", "boolean"), ("optimizeAcknowledgeTimeOut", "long"),
        ("optimizedAckScheduledAckInterval", "long"), ("optimizedMessageDispatch", "boolean"),
        ("producerWindowSize", "int"), ("rmIdFromConnectionId", "boolean"), ("sendAcksAsync", "boolean"),
        ("statsEnabled", "boolean"), ("transactedIndividualAck", "boolean"), ("trustAllPackages", "boolean"),
        ("useDedicatedTaskRunner", "boolean"), ("useRetroactiveConsumer", "boolean"),
        ("warnAboutUnstartedConnectionTimeout", "long"))),
    *(_i(f"jms.redeliveryPolicy.{n}", t, _REDELIVERY) for n, t in (
        ("backOffMultiplier", "double"), ("collisionAvoidancePercent", "short"), ("destination", "String"),
        ("initialRedeliveryDelay", "long"), ("maximumRedeliveries", "int"), ("maximumRedeliveryDelay", "long"),
        ("preDispatchCheck", "boolean"), ("queue", "String"), ("redeliveryDelay", "long"), ("tempQueue", "boolean"),
        ("tempTopic", "boolean"), ("topic", "String"), ("useCollisionAvoidance", "boolean"),
        ("useExponentialBackOff", "boolean"))),
    *(_i(f"jms.blobTransferPolicy.{n}", t, "BlobMessage is OpenWire-only") for n, t in (
        ("brokerUploadUrl", "String"), ("bufferSize", "int"), ("defaultUploadUrl", "String"),
        ("uploadUrl", "String"))),
)

#: InactivityMonitor options: ActiveMQ refuses them with useInactivityMonitor=false
MONITOR_OPTIONS = frozenset(o.name for o in TRANSPORT if o.ignored == _MONITOR)

TABLES: dict[str, tuple[AmqOption, ...]] = {"transport": TRANSPORT, "failover": FAILOVER, "static": STATIC,
                                             "jms": JMS}
_PREFIXES = ("jms.prefetchPolicy.", "jms.redeliveryPolicy.", "jms.blobTransferPolicy.", "jms.", "wireFormat.",
             "socket.")


def bean_key(name: str) -> str:
    """``prefix + rest`` with the first letter of ``rest`` lower-cased (ActiveMQ's setter rule)."""
    prefix = next((p for p in _PREFIXES if name.startswith(p)), "")
    rest = name[len(prefix):]
    if "." in rest:  # not a setter's name: ActiveMQ looks for set<rest> as written
        return name
    return prefix + rest[:1].lower() + rest[1:]


_INDEX: dict[str, dict[str, AmqOption]] = {
    scope: {bean_key(o.name): o for o in table} for scope, table in TABLES.items()
}


def lookup(scope: Scope, key: str) -> AmqOption | None:
    """The option ``key`` names in ``scope`` (ActiveMQ's name rules), or None."""
    option = _INDEX[scope].get(bean_key(key))
    if option is None or (option.exact and key != option.name):
        return None
    return option


def bean_match(key: str, names: Iterable[str]) -> str | None:
    """The name among ``names`` that ``key`` means by ActiveMQ's first-letter rule."""
    wanted = bean_key(key)
    for name in names:
        if bean_key(name) == wanted:
            return name
    return None


#: the protocol names Java's SSLSocket takes
TLS_PROTOCOLS = ("TLSv1.3", "TLSv1.2", "TLSv1.1", "TLSv1", "SSLv3", "SSLv2Hello")
_CIPHER = re.compile(r"(?:TLS|SSL)_[A-Z0-9_]+")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_INT_RANGES = {"short": 16, "int": 32, "long": 64, "tos": 32}
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_JAVA_DOUBLE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[dDfF]?")
_DSCP_NAMES = {"EF": 46, **{f"CS{i}": 8 * i for i in range(8)},
               **{f"AF{x}{y}": 8 * x + 2 * y for x in range(1, 5) for y in range(1, 4)}}


def java_value_error(java: str, value: str) -> str | None:
    """Why ``value`` is not a value of Java type ``java`` as ActiveMQ converts it (None: fine)."""
    if java in ("boolean", "Boolean"):
        return None if value.lower() in ("true", "false") else f"expected true or false, got {value!r}"
    if java in _INT_RANGES:
        bits = _INT_RANGES[java]
        if not _JAVA_INT.fullmatch(value):
            return f"expected an integer, got {value!r}"
        number = int(value)
        if not -(2 ** (bits - 1)) <= number < 2 ** (bits - 1):
            return f"{value} is out of range for a Java {java}"
        if java == "tos" and not 0 <= number <= 255:
            return f"expected 0 to 255, got {value}"
        return None
    if java == "double":
        return None if _JAVA_DOUBLE.fullmatch(value) else f"expected a number, got {value!r}"
    if java == "openwire":
        ok = _JAVA_INT.fullmatch(value) and 1 <= int(value) <= 12
        return None if ok else f"expected an OpenWire version 1 to 12, got {value!r}"
    if java == "protocols":
        bad = [p for p in value.split(",") if p not in TLS_PROTOCOLS]
        return f"unknown TLS protocol {bad[0]!r}; valid: {', '.join(TLS_PROTOCOLS)}" if bad else None
    if java == "ciphers":  # the form only: which suites the JDK supports is the JDK's
        bad = [c for c in value.split(",") if not _CIPHER.fullmatch(c)]
        return f"expected cipher-suite names such as TLS_AES_128_GCM_SHA256, got {bad[0]!r}" if bad else None
    if java == "uri":
        return None if _SCHEME.match(value) else f"expected a URI such as tcp://host:61616, got {value!r}"
    if java == "dscp":
        if value in _DSCP_NAMES or (_JAVA_INT.fullmatch(value) and 0 <= int(value) <= 63):
            return None
        return f"expected a DiffServ class (EF, AF11..AF43, CS0..CS7) or 0-63, got {value!r}"
    return None  # String, String[]


def conflict(kept: dict[str, str]) -> tuple[str, str] | None:
    """``(name, why)`` for an option ActiveMQ refuses next to the others kept on a broker URI."""
    if kept.get("useInactivityMonitor", "").lower() == "false":
        for name in sorted(MONITOR_OPTIONS & kept.keys()):
            return name, "configures the inactivity monitor, which useInactivityMonitor=false turns off"
    if "soWriteTimeout" in kept and "negotiateTimeout" in kept:
        return "negotiateTimeout", "is not taken next to soWriteTimeout (ActiveMQ's write-timeout filter hides it)"
    for name in ("writeTimeout", "sleep"):
        if name in kept and "soWriteTimeout" not in kept:
            return name, "configures the write-timeout filter that soWriteTimeout turns on"
    return None


def meaning_of(scope: Scope, name: str) -> tuple[str, str]:
    """``("became", text)`` or ``("ignored", reason)`` for an ActiveMQ option."""
    option = lookup(scope, name)
    if option is None:
        return ("became", OWN_MEANINGS.get(name, ""))
    return ("ignored", option.ignored) if option.ignored else ("became", option.became or OWN_MEANINGS.get(name, ""))


#: what our own option names (and ActiveMQ's that are our model's fields) do, for explain
OWN_MEANINGS: dict[str, str] = {
    "connectTimeout": "ms to connect and receive CONNECTED",
    "heartBeat": "the STOMP heart-beat cx,cy offered in CONNECT, ms",
    "host": "the CONNECT host header (RabbitMQ's virtual host)",
    "dialect": "the broker's STOMP dialect",
    "textMode": "text bodies go without content-length",
    "duplicateIdHeader": "a header that also carries the idempotency key",
    "caFile": "the CA certificates TLS trusts",
    "certFile": "the client certificate",
    "keyFile": "the client certificate's key",
    "verify": "false: TLS checks neither the chain nor the host name",
    "serverHostname": "the name TLS checks the certificate against (SNI too)",
    "randomize": "shuffle the list on every pass",
    "initialReconnectDelay": "the delay after the first failed pass, ms",
    "maxReconnectDelay": "the cap of the reconnect delay, ms",
    "useExponentialBackOff": "the delay grows after every failed pass",
    "reconnectDelayExponent": "the delay's growth factor",
    "backOffMultiplier": "the delay's growth factor",
    "maxReconnectAttempts": "passes before the error goes up",
    "startupMaxReconnectAttempts": "passes before the first connection",
    "timeout": "ms a send may wait while disconnected",
    "priorityBackup": "the priority brokers go first on every pass",
    "priorityURIs": "the brokers preferred",
    "backup": "keep a connection to the next broker open",
    "backupPoolSize": "how many backup connections",
    "trackMessages": "replay unreceipted sends on reconnect",
    "maxCacheSize": "bytes of sends kept for replay",
    "warnAfterReconnectAttempts": "log a warning after this many passes",
    "updateURIsURL": "read more brokers from this file or URL",
    "reconnectJitter": "random fraction added to each delay",
    "probeInterval": "TCP probes cut a back-off or an unanswered CONNECT short, ms",
    "minConnectTime": "a connection that lived this long resets the delay, ms",
}


def _ms(amq: Sequence[tuple[str, str]], name: str) -> int | None:
    for key, value in amq:
        if key == name:
            return int(value)
    return None


def _get(amq: Sequence[tuple[str, str]], name: str) -> str | None:
    for key, value in amq:
        if key == name:
            return value
    return None


def heartbeat_of(amq: Sequence[tuple[str, str]]) -> tuple[int, int] | None:
    """The heart-beat these ActiveMQ options ask for (None: they say nothing)."""
    duration = _ms(amq, "wireFormat.maxInactivityDuration")
    if duration is not None:
        return (max(duration, 0), max(duration, 0))
    monitor = _get(amq, "useInactivityMonitor")
    if monitor is not None and monitor.lower() == "false":
        return (0, 0)
    return None


def first_deadline_grace_ms(amq: Sequence[tuple[str, str]]) -> int:
    """``wireFormat.maxInactivityDurationInitalDelay`` (0 when not given)."""
    return max(_ms(amq, "wireFormat.maxInactivityDurationInitalDelay") or 0, 0)


@dataclass(frozen=True)
class SocketSettings:
    """Socket and TLS settings from a broker URI's ActiveMQ options (None: leave as is)."""

    keep_alive: bool | None = None
    tcp_no_delay: bool = True
    receive_buffer: int | None = None
    send_buffer: int | None = None
    linger: int | None = None
    tos: int | None = None
    write_timeout_ms: int | None = None
    verify_host_name: bool | None = None
    tls_versions: tuple[str, ...] = ()


def _flag(value: str | None) -> bool | None:
    return None if value is None else value.lower() == "true"


def socket_settings(amq: Sequence[tuple[str, str]]) -> SocketSettings:
    """What the link sets on its socket (``socket.*`` wins over the plain name)."""
    def pick(*names: str) -> str | None:
        found = None
        for name in names:
            value = _get(amq, name)
            if value is not None:
                found = value
        return found

    keep_alive = _flag(pick("keepAlive", "socket.keepAlive"))
    no_delay = _flag(pick("tcpNoDelay", "socket.tcpNoDelay"))
    size = _ms(amq, "socketBufferSize")
    receive = _ms(amq, "socket.receiveBufferSize")
    send = _ms(amq, "socket.sendBufferSize")
    tos_text = pick("typeOfService", "socket.trafficClass")
    dscp = _get(amq, "diffServ")
    tos = int(tos_text) if tos_text is not None else None
    if dscp is not None:
        tos = (_DSCP_NAMES[dscp] if dscp in _DSCP_NAMES else int(dscp)) << 2
    linger = _ms(amq, "soLinger")
    write = _ms(amq, "writeTimeout") or _ms(amq, "soWriteTimeout")
    protocols = pick("socket.enabledProtocols")
    return SocketSettings(
        keep_alive=keep_alive,
        tcp_no_delay=True if no_delay is None else no_delay,
        receive_buffer=receive if receive is not None else size,
        send_buffer=send if send is not None else size,
        linger=linger,
        tos=tos,
        write_timeout_ms=write if write else None,
        verify_host_name=_flag(pick("verifyHostName", "socket.verifyHostName")),
        tls_versions=tuple(p.strip() for p in protocols.split(",") if p.strip()) if protocols else (),
    )


def prefetch_policy(amq: Sequence[tuple[str, str]]) -> dict[str, int]:
    """``{"queue"|"topic"|"durable"|"browser": n}`` from ``jms.prefetchPolicy.*`` (``all`` first,
    then the specific ones; 0 becomes 1, the least STOMP can ask for)."""
    out: dict[str, int] = {}
    every = _ms(amq, "jms.prefetchPolicy.all")
    if every is not None:
        out = dict.fromkeys(("queue", "topic", "durable", "browser"), every)
    for kind, name in (("queue", "queuePrefetch"), ("topic", "topicPrefetch"), ("durable", "durableTopicPrefetch"),
                       ("browser", "queueBrowserPrefetch")):
        value = _ms(amq, f"jms.prefetchPolicy.{name}")
        if value is not None:
            out[kind] = value
    return {kind: max(n, 1) for kind, n in out.items()}


def jms_credentials(amq: Sequence[tuple[str, str]]) -> tuple[str | None, str | None, str | None]:
    """``(userName, password, clientID)`` given as ``jms.*`` options (empty text: not given)."""
    return (_get(amq, "jms.userName") or None, _get(amq, "jms.password") or None,
            _get(amq, "jms.clientID") or None)
